// CPU kernels: the fused tile kernels (fused_attention.h) for fp32, bf16 and fp16; float64,
// which gradcheck and the float64 reference use, takes the blockwise matmul path
// (blockwise_attention.h), whose matmuls run in fp64 on the CPU BLAS.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../blockwise_attention.h"
#include "../checks.h"
#include "fused_attention.h"

namespace psa_fa2 {
namespace {

void check_cpu_impl(Impl impl) {
  TORCH_CHECK(impl != Impl::kFast,
              "impl=\"fast\" needs CUDA tensors; the CPU has one kernel (use \"auto\" or "
              "\"reference\")");
}

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale,
                                           c10::string_view impl) {
  const AttnShape s = check_fwd_inputs(q, k, v);
  check_cpu_impl(parse_impl(impl));
  at::Tensor out = empty_in_layout(s, s.head_dim_v, s.layout, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads, s.seqlen},
                             q.options().dtype(accumulate_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  if (q.scalar_type() == at::kDouble) {
    blockwise_fwd(q, k, v, scale, out, lse, kBlockwiseElemsCpu);
  } else {
    cpu::fused_fwd(s, q, k, v, scale, out, lse);
  }
  return {out, lse};
}

void bwd_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, double scale, at::Tensor& dq,
             at::Tensor& dk, at::Tensor& dv, c10::string_view impl, bool /*deterministic*/,
             bool accumulate) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  check_cpu_impl(parse_impl(impl));
  if (!accumulate) zero_qk_grads(dq, dk);
  if (q.numel() == 0 || v.numel() == 0) return;
  // Both paths are deterministic: fixed orders of summation, no atomics.
  if (q.scalar_type() == at::kDouble) {
    blockwise_bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, kBlockwiseElemsCpu);
  } else {
    cpu::fused_bwd(s, dout, q, k, v, out, lse, scale, dq, dk, dv);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

}  // namespace psa_fa2
