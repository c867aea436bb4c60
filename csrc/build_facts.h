// What this build holds, for the bindings (ops.cpp): answered by cuda/device_desc.cpp and
// cuda/launch.cpp in builds with the CUDA kernels, and by build_cpu_only.cpp in CPU-only ones.
// setup.py compiles one side or the other, so no source needs to ask which build it is in.
#pragma once

#include <string>
#include <vector>

#include "cuda/plan.h"

namespace psa_fa2 {

struct BuildFacts {
  bool cuda = false;                      // the CUDA kernels are built
  std::string cuda_version;               // of the toolkit that built them ("" without)
  std::string cuda_archs;                 // the arch list setup.py built for ("" without)
  std::vector<std::string> cuda_kernels;  // the CUDA kernel families built
};
BuildFacts build_facts();

// Plans the CUDA ops' calls with these overrides from now on (psa_fa2_ext._testing.force);
// a CPU-only build has no CUDA calls to plan and raises.
void set_plan_overrides(const PlanOverrides& overrides);

// Whether the current GPU runs this build's kernels (false in a CPU-only build).
bool current_device_runs_kernels();

}  // namespace psa_fa2
