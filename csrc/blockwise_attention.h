// Attention on the matmul library, blockwise over query rows and all (batch, head) pairs at
// once: S, P (and dS) of one block of rows are recomputed with at::matmul, so memory is
// O(B * H * block * N), never N x N per head. Half types are computed in fp32, float64 in
// fp64. On CUDA at::matmul follows PyTorch's fp32 matmul rule (TF32 unless "highest").
//
// Used by the CPU kernels (forward and backward, every dtype) and by the CUDA backward for
// float32, which has no tensor-core kernel.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace psa_fa2 {

// Elements of one [B, H, block, N] intermediate of the accumulation type that pick the
// block: big blocks make wide matmuls, small ones keep the intermediates in cache.
constexpr int64_t kBlockwiseElemsCpu = int64_t(1) << 22;   // 16 MB in fp32
constexpr int64_t kBlockwiseElemsCuda = int64_t(1) << 26;  // 256 MB in fp32

// out = softmax(scale q k^T) v and lse = logsumexp(scale q k^T) (natural log) into the
// given tensors. Tensors are logical [B, H, N, D] (any strides; out as fwd allocates it),
// lse [B, H, N] contiguous of the accumulation type.
void blockwise_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   double scale, at::Tensor& out, at::Tensor& lse, int64_t block_elems);

// The bwd op's contract: dq += dL/dq, dk += dL/dk, dv = dL/dv; lse from the forward.
void blockwise_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                   double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                   int64_t block_elems);

}  // namespace psa_fa2
