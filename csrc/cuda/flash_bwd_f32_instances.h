// Declarations of the float32 backward instantiations (flash_bwd_f32_kernel.cuh), one unit
// each: flash_bwd_f32_32x64_cf.cu, flash_bwd_f32_32x64_tm.cu.
#pragma once

#include <cuda_runtime.h>

#include "attention_params.h"

namespace psa_fa2 {

template <int kDk, int kDv, Layout kLayout>
void launch_flash_bwd_f32(const BwdParams& params, int pieces, cudaStream_t stream);

extern template void launch_flash_bwd_f32<32, 64, Layout::kChannelFirst>(const BwdParams&, int,
                                                                          cudaStream_t);
extern template void launch_flash_bwd_f32<32, 64, Layout::kTokenMajor>(const BwdParams&, int,
                                                                        cudaStream_t);

}  // namespace psa_fa2
