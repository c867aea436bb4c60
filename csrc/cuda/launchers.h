// Entry points of the CUDA kernels, called from attention_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention_params.h"

namespace psa_fa2 {

// Reference kernels (the seed's design): grid (N, BH, 1), one CTA per query row.
// Any N, any head dims <= 256, every dtype.
void reference_fwd(const FwdParams& params, cudaStream_t stream);
void reference_bwd(const BwdParams& params, cudaStream_t stream);

// Fast tensor-core forward (FlashAttention-2 tiling). Returns false, launching
// nothing, when no fast instantiation covers params (dtype, head dims, layout).
bool flash_fwd_supported(const FwdParams& params);
void flash_fwd(const FwdParams& params, cudaStream_t stream);

// Fast float32 forward (FlashAttention-2 tiling on FFMA, exact fp32 arithmetic); the same
// contract as flash_fwd_supported / flash_fwd.
bool flash_fwd_f32_supported(const FwdParams& params);
void flash_fwd_f32(const FwdParams& params, cudaStream_t stream);

// Fast tensor-core backward. flash_bwd_workspace_bytes tells how much scratch
// (params.workspace) flash_bwd needs; the caller allocates it uninitialised.
bool flash_bwd_supported(const BwdParams& params);
size_t flash_bwd_workspace_bytes(const BwdParams& params);
void flash_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace psa_fa2
