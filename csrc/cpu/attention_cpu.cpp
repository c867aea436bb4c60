// CPU kernels, as on CUDA by impl:
//   "fast":      the fused tile kernels (fused_attention.h): fp32, bf16 and fp16;
//   "reference": the blockwise matmul path (blockwise_attention.h), every dtype: query blocks
//                of S and P recomputed with at::matmul, the yardstick the fused kernels'
//                tests and benchmarks can be held to on the same machine;
//   "auto":      fast where it exists, else (float64, which gradcheck and the float64
//                references use) the blockwise path, whose matmuls then run in fp64.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../blockwise_attention.h"
#include "../checks.h"
#include "fused_attention.h"

namespace psa_fa2 {
namespace {

// Whether this call runs the fused kernels.
bool use_fused(Impl impl, at::ScalarType dtype) {
  const bool fused_dtype = dtype != at::kDouble;
  TORCH_CHECK(impl != Impl::kFast || fused_dtype,
              "impl=\"fast\" on the CPU needs float32, bfloat16 or float16 inputs, got ", dtype,
              " (\"auto\" and \"reference\" run float64 on the blockwise matmul path)");
  return impl != Impl::kReference && fused_dtype;
}

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale,
                                           c10::string_view impl) {
  const AttnShape s = check_fwd_inputs(q, k, v);
  const bool fused = use_fused(parse_impl(impl), q.scalar_type());
  at::Tensor out = empty_output_like(q, s, s.layout, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads, s.seqlen},
                             q.options().dtype(accumulate_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  if (fused) {
    cpu::fused_fwd(s, q, k, v, scale, out, lse);
  } else {
    blockwise_fwd(q, k, v, scale, out, lse, kBlockwiseElemsCpu);
  }
  return {out, lse};
}

void bwd_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, double scale, at::Tensor& dq,
             at::Tensor& dk, at::Tensor& dv, c10::string_view impl, bool /*deterministic*/,
             bool accumulate) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  const bool fused = use_fused(parse_impl(impl), q.scalar_type());
  if (!accumulate) zero_qk_grads(dq, dk);
  if (q.numel() == 0 || v.numel() == 0) return;
  // Both paths are deterministic: fixed orders of summation, no atomics.
  if (fused) {
    cpu::fused_bwd(s, dout, q, k, v, out, lse, scale, dq, dk, dv);
  } else {
    blockwise_bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, kBlockwiseElemsCpu);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

}  // namespace psa_fa2
