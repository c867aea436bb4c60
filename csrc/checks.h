// Argument validation shared by the CPU and CUDA implementations.
// Every message names the argument, what was expected and what came.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "cuda/attention_params.h"
#include "layout.h"
#include "messages.h"

namespace psa_fa2 {

// Largest head dim any kernel accepts (the reference kernels keep two values per
// thread of a 128-thread CTA).
constexpr int64_t kMaxHeadDim = 256;

// The dtype of lse and of every accumulator: fp32, or fp64 for float64 inputs.
inline at::ScalarType accumulate_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_rank4(const at::Tensor& t, const char* name, const char* dims) {
  TORCH_CHECK(t.dim() == 4, name, " must be a 4-d tensor ", dims, ", got ", str(t.dim()),
              "-d with ", describe(t));
}

inline void check_same_dtype_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " must have the dtype of q (",
              q.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), name, " must be on the device of q (", str(q.device()),
              "), got ", str(t.device()));
}

inline void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef expected,
                        const char* dims) {
  TORCH_CHECK(t.sizes() == expected, name, " must have shape ", str(expected), " ", dims, ", got ",
              describe(t));
}

inline AttnShape check_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_rank4(q, "q", "[B, H, N, dk]");
  check_rank4(k, "k", "[B, H, N, dk]");
  check_rank4(v, "v", "[B, H, N, dv]");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kBFloat16 ||
                  dtype == at::kHalf,
              "q must be float64, float32, bfloat16 or float16, got ", dtype);
  check_same_dtype_device(k, "k", q);
  check_same_dtype_device(v, "v", q);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), dk = q.size(3), dv = v.size(3);
  check_shape(k, "k", {B, H, N, dk}, "[B, H, N, dk] (like q)");
  TORCH_CHECK(v.size(0) == B && v.size(1) == H && v.size(2) == N, "v must have shape [", str(B), ", ",
              str(H), ", ", str(N), ", dv] ([B, H, N] of q), got ", describe(v));
  TORCH_CHECK(dk >= 1 && dk <= kMaxHeadDim, "q and k head dim (dk) must be in [1, ", str(kMaxHeadDim),
              "], got ", str(dk));
  TORCH_CHECK(dv >= 1 && dv <= kMaxHeadDim, "v head dim (dv) must be in [1, ", str(kMaxHeadDim),
              "], got ", str(dv));
  TORCH_CHECK(N <= INT32_MAX, "the sequence length N must be below 2^31, got N = ", str(N));
  const Layout layout = common_layout({{"q", &q}, {"k", &k}, {"v", &v}});
  return {B, H, N, dk, dv, layout};
}

inline AttnShape check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out,
                                  const at::Tensor& lse, const at::Tensor& dq,
                                  const at::Tensor& dk, const at::Tensor& dv) {
  AttnShape s = check_fwd_inputs(q, k, v);
  check_rank4(out, "out", "[B, H, N, dv]");
  check_rank4(dout, "dout", "[B, H, N, dv]");
  check_rank4(dq, "dq", "[B, H, N, dk]");
  check_rank4(dk, "dk", "[B, H, N, dk]");
  check_rank4(dv, "dv", "[B, H, N, dv]");
  const std::vector<int64_t> qk_shape{s.batch, s.heads, s.seqlen, s.head_dim_qk};
  const std::vector<int64_t> v_shape{s.batch, s.heads, s.seqlen, s.head_dim_v};
  check_shape(out, "out", v_shape, "[B, H, N, dv]");
  check_shape(dout, "dout", v_shape, "[B, H, N, dv]");
  check_shape(dq, "dq", qk_shape, "[B, H, N, dk] (like q)");
  check_shape(dk, "dk", qk_shape, "[B, H, N, dk] (like k)");
  check_shape(dv, "dv", v_shape, "[B, H, N, dv] (like v)");
  check_same_dtype_device(out, "out", q);
  check_same_dtype_device(dout, "dout", q);
  check_same_dtype_device(dq, "dq", q);
  check_same_dtype_device(dk, "dk", q);
  check_same_dtype_device(dv, "dv", q);
  check_shape(lse, "lse", {s.batch, s.heads, s.seqlen}, "[B, H, N]");
  const auto acc = accumulate_dtype(q.scalar_type());
  TORCH_CHECK(lse.scalar_type() == acc, "lse must be ", acc, " for ", q.scalar_type(),
              " inputs (as fwd returns it), got ", lse.scalar_type());
  TORCH_CHECK(lse.device() == q.device(), "lse must be on the device of q (", str(q.device()),
              "), got ", str(lse.device()));
  TORCH_CHECK(lse.is_contiguous(), "lse must be contiguous, got ", describe(lse));
  s.layout = common_layout({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout},
                            {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  return s;
}

// For bwd(accumulate=False) where the kernel can only add: dq = dk = 0 first.
inline void zero_qk_grads(at::Tensor& dq, at::Tensor& dk) {
  dq.zero_();
  dk.zero_();
}

inline Impl parse_impl(c10::string_view impl) {
  if (impl == "auto") return Impl::kAuto;
  if (impl == "fast") return Impl::kFast;
  if (impl == "reference") return Impl::kReference;
  TORCH_CHECK(false, "impl must be \"auto\", \"fast\" or \"reference\", got \"", std::string(impl),
              "\"");
}

inline Strided4 strided(const at::Tensor& t) {
  return {const_cast<void*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

}  // namespace psa_fa2
