// Dispatch of the fast tensor-core forward: picks the instantiation for (dtype, dk, dv, layout,
// global access width) and checks the assumptions of flash_fwd_kernel.cuh. Anything not covered returns
// false from flash_fwd_supported, and the caller falls back to reference_fwd.
//
// On Hopper (compute capability 9.0) the wgmma kernel (flash_fwd_sm90_kernel.cuh) runs where it
// has an instantiation and sm90_kernels_enabled() (sm90_device.h: an sm_90a build, and
// PSA_FA2_DISABLE_SM90 not 1); the mma.sync kernel everywhere else. Both compute
// the same math in fp32 on the same bf16 / fp16 probabilities; only the tensor-core summation
// order differs.
#include "flash_fwd_instances.h"
#include "flash_fwd_sm90_instances.h"
#include "fwd_dispatch_common.h"
#include "launchers.h"
#include "sm90_device.h"

namespace psa_fa2 {
namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

// X(...) of the instances headers: the launcher of one instantiation, if it matches.
#define PSA_FA2_MATCH(dt, dk, dv, lay, vec)                                         \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && vec_bytes == vec)                                  \
    return &PSA_FA2_LAUNCHER<DType::dt, dk, dv, Layout::lay, vec>;

Launcher find_launcher(const FwdParams& p, int vec_bytes) {
#define PSA_FA2_LAUNCHER launch_flash_fwd
  PSA_FA2_FLASH_FWD_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_LAUNCHER
  return nullptr;
}

Launcher find_sm90_launcher(const FwdParams& p, int vec_bytes) {
#define PSA_FA2_LAUNCHER launch_flash_fwd_sm90
  PSA_FA2_FLASH_FWD_SM90_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_LAUNCHER
  return nullptr;
}

#undef PSA_FA2_MATCH

Launcher select(const FwdParams& p) {
  if (!fwd_dispatch::params_ok(p)) return nullptr;
  // 16, 8, 4 or 2 bytes: 8, 4, 2 or 1 elements.
  const int vec = fwd_dispatch::common_vec_bytes(p, 2, {16, 8, 4, 2});
  // Token-major instantiations exist for 16-byte rows only; channel-first for every width >= 2
  // (16: "cf"; 8, 4 and 2: "cfu", see generate_flash_fwd.py).
  if (!(vec == 16 || (p.layout == Layout::kChannelFirst && vec >= 2))) return nullptr;
  if (sm90_kernels_enabled()) {
    if (Launcher launch = find_sm90_launcher(p, vec)) return launch;
  }
  return find_launcher(p, vec);
}

}  // namespace

bool flash_fwd_supported(const FwdParams& p) { return select(p) != nullptr; }

void flash_fwd(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
