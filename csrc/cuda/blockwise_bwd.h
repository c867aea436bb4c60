// float32 backward on the matmul library: query blocks of S, P and dS recomputed with
// at::matmul, so PyTorch's fp32 matmul rule (TF32 unless "highest") applies as it does to
// any matmul. Memory O(block * N) per (batch, head), never N x N.
#pragma once

#include <ATen/ATen.h>

namespace psa_fa2 {

// The bwd op's contract: dq += dL/dq, dk += dL/dk, dv = dL/dv. Tensors are logical
// [B, H, N, D] of one dtype, any strides; lse [B, H, N] fp32, from the forward.
void blockwise_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                   double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv);

}  // namespace psa_fa2
