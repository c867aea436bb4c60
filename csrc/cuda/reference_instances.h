// Per-dtype entry points of the reference kernels, each defined in its own generated .cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "attention_params.h"

namespace psa_fa2 {
namespace reference {
template <typename T> void fwd(const FwdParams& p, cudaStream_t stream);
template <typename T> void bwd(const BwdParams& p, cudaStream_t stream);
}  // namespace reference
}  // namespace psa_fa2
