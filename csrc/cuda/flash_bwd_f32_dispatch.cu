// Dispatch of the float32 backward (flash_bwd_f32_kernel.cuh): the instantiation for (dk, dv,
// layout). Anything not covered returns false from flash_bwd_f32_supported, and the caller runs
// the blockwise backward instead.
#include "flash_bwd_f32_instances.h"
#include "launchers.h"

namespace psa_fa2 {

namespace {

using Launcher = void (*)(const BwdParams&, cudaStream_t);

Launcher select(const BwdParams& p) {
  if (p.dtype != DType::kFloat32 || p.head_dim_qk != 32 || p.head_dim_v != 64) return nullptr;
  return p.layout == Layout::kChannelFirst ? &launch_flash_bwd_f32<32, 64, Layout::kChannelFirst>
                                           : &launch_flash_bwd_f32<32, 64, Layout::kTokenMajor>;
}

}  // namespace

bool flash_bwd_f32_supported(const BwdParams& p) { return select(p) != nullptr; }

void flash_bwd_f32(const BwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
