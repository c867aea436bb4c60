// build_facts.h for a build without the CUDA kernels (setup.py compiles this file only then).
#include "build_facts.h"

#include <c10/util/Exception.h>

namespace psa_fa2 {

BuildFacts build_facts() { return {}; }

void set_plan_overrides(const PlanOverrides&) {
  TORCH_CHECK(false, "psa_fa2_ext was built without CUDA kernels: there are no CUDA calls to plan");
}

bool current_device_runs_kernels() { return false; }

}  // namespace psa_fa2
