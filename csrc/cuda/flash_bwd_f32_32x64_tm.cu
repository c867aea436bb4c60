// The float32 backward at (dk, dv) = (32, 64), token-major (flash_bwd_f32_instances.h).
#include "flash_bwd_f32_kernel.cuh"

namespace psa_fa2 {
template void launch_flash_bwd_f32<32, 64, Layout::kTokenMajor>(const BwdParams&, int, cudaStream_t);
}  // namespace psa_fa2
