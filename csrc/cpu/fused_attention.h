// The fused CPU kernels: FlashAttention-style tiling on the CPU. One task per (batch, head,
// tile), run by at::parallel_for; the scores of a tile stay in cache and never reach memory,
// so memory beyond the inputs and outputs is O(tile) per thread, plus O(N) per head for the
// backward's dq sums. fp32, bf16 and fp16 inputs, computed in fp32; any strides that
// check_fwd_inputs accepts, read in place.
#pragma once

#include <ATen/ATen.h>

#include "../checks.h"

namespace psa_fa2 {
namespace cpu {

// out = softmax(scale q k^T) v and lse = logsumexp(scale q k^T) (natural log), written into
// the given tensors (out in s.layout, lse [B, H, N] fp32 contiguous).
void fused_fwd(const AttnShape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               double scale, at::Tensor& out, at::Tensor& lse);

// The bwd op's contract: dq += dL/dq, dk += dL/dk, dv = dL/dv. Deterministic: every sum is
// taken in a fixed order for a given shape and thread count.
void fused_bwd(const AttnShape& s, const at::Tensor& dout, const at::Tensor& q,
               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, at::Tensor& dq, at::Tensor& dk,
               at::Tensor& dv);

}  // namespace cpu
}  // namespace psa_fa2
