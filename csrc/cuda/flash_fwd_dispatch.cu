// Dispatch of the fast tensor-core forward: picks the instantiation for (dtype, dk, dv, layout,
// global access width) and checks the assumptions of flash_fwd_kernel.cuh. Anything not covered returns
// false from flash_fwd_supported, and the caller falls back to reference_fwd.
#include "flash_fwd_instances.h"
#include "fwd_dispatch_common.h"
#include "launchers.h"

namespace psa_fa2 {
namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

Launcher find_launcher(const FwdParams& p, int vec_bytes) {
#define PSA_FA2_MATCH(dt, dk, dv, lay, vec)                                         \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && vec_bytes == vec)                                  \
    return &launch_flash_fwd<DType::dt, dk, dv, Layout::lay, vec>;
  PSA_FA2_FLASH_FWD_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
}

Launcher select(const FwdParams& p) {
  if (!fwd_dispatch::params_ok(p)) return nullptr;
  // 16, 8, 4 or 2 bytes: 8, 4, 2 or 1 elements.
  const int vec = fwd_dispatch::common_vec_bytes(p, 2, {16, 8, 4, 2});
  // Token-major instantiations exist for 16-byte rows only; channel-first for every width >= 2
  // (16: "cf"; 8, 4 and 2: "cfu", see generate_flash_fwd.py).
  if (vec == 16 || (p.layout == Layout::kChannelFirst && vec >= 2)) return find_launcher(p, vec);
  return nullptr;
}

}  // namespace

bool flash_fwd_supported(const FwdParams& p) { return select(p) != nullptr; }

void flash_fwd(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
