// The layout rules of every path (CPU, CUDA, autograd): which layout a call's tensors share,
// and how tensors are put in one. psa_fa2_ext/ops.py states the same rules for the fake
// kernels and the compiled autograd, which run on symbolic shapes that C++ cannot read;
// tests/test_layout_rules.py checks that the two agree.
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "cuda/attention_params.h"
#include "messages.h"

namespace psa_fa2 {

// A logical [B, H, N, D] tensor is token-major when D has stride 1 and channel-first
// when N has stride 1; a dimension of size <= 1, or an empty tensor, has no stride that
// matters.
inline bool is_token_major(const at::Tensor& t) {
  return t.numel() == 0 || t.size(3) <= 1 || t.stride(3) == 1;
}
inline bool is_channel_first(const at::Tensor& t) {
  return t.numel() == 0 || t.size(2) <= 1 || t.stride(2) == 1;
}

inline const char* layout_name(Layout layout) {
  return layout == Layout::kTokenMajor ? "token-major" : "channel-first";
}

struct AttnShape {
  int64_t batch, heads, seqlen, head_dim_qk, head_dim_v;
  Layout layout;
};

// The layout every tensor allows: token-major first, else channel-first; none if they share
// neither.
inline std::optional<Layout> shared_layout(std::initializer_list<const at::Tensor*> ts) {
  bool token_major = true, channel_first = true;
  for (const at::Tensor* t : ts) {
    token_major = token_major && is_token_major(*t);
    channel_first = channel_first && is_channel_first(*t);
  }
  if (token_major) return Layout::kTokenMajor;
  if (channel_first) return Layout::kChannelFirst;
  return std::nullopt;
}

// The shared layout of a whole call's tensors (shared_layout), or an error naming each
// tensor's.
inline Layout common_layout(std::initializer_list<std::pair<const char*, const at::Tensor*>> ts) {
  bool token_major = true, channel_first = true;
  for (const auto& [name, t] : ts) {
    token_major = token_major && is_token_major(*t);
    channel_first = channel_first && is_channel_first(*t);
  }
  if (token_major) return Layout::kTokenMajor;
  if (channel_first) return Layout::kChannelFirst;
  std::string got;
  for (const auto& [name, t] : ts) {
    got += std::string(" ") + name + ": " +
           (is_token_major(*t) ? "token-major" : is_channel_first(*t) ? "channel-first" : "neither") +
           " (strides " + str(t->strides()) + ");";
  }
  TORCH_CHECK(false,
              "all tensors of one call must share one layout of the logical [B, H, N, D] view: "
              "token-major (stride(-1) == 1) or channel-first (stride(-2) == 1); got",
              got);
}

// Allocates a logical [B, H, N, D] tensor in the given layout (channel-first: the
// transpose of a contiguous [B, H, D, N], made in one op).
inline at::Tensor empty_in_layout(const AttnShape& s, int64_t d, Layout layout,
                                  const at::TensorOptions& options) {
  if (layout == Layout::kTokenMajor) return at::empty({s.batch, s.heads, s.seqlen, d}, options);
  return at::empty_strided({s.batch, s.heads, s.seqlen, d},
                           {s.heads * d * s.seqlen, d * s.seqlen, 1, s.seqlen}, options);
}

// The forward's output ([B, H, N, dv]) for inputs like q: in `layout`, with the heads inside
// the dim that holds them in q, so that the caller's view back to its own layout is free:
// - channel-first, heads inside the head dim: q as area views (psa_attention with area > 1:
//   [B * H, area, N / area, D] of a [B, H, D, N] block view, whose "heads" are runs of N); out
//   is then the block's [B, H, dv, N] memory;
// - token-major, heads inside the tokens: the [B, N, H, D] head views of a projection (as
//   nn.MultiheadAttention and RT-DETR's AIFI make them); out is then [B, N, H * dv] memory.
// Every other input gets empty_in_layout's output.
inline at::Tensor empty_output_like(const at::Tensor& q, const AttnShape& s, Layout layout,
                                    const at::TensorOptions& options) {
  const int64_t B = s.batch, H = s.heads, N = s.seqlen, dv = s.head_dim_v;
  if (H > 1 && N > 1 && q.size(3) > 1) {
    if (layout == Layout::kChannelFirst && q.stride(1) < q.stride(3))
      return at::empty_strided({B, H, N, dv}, {dv * H * N, N, 1, H * N}, options);
    if (layout == Layout::kTokenMajor && q.stride(1) < q.stride(2))
      return at::empty_strided({B, H, N, dv}, {N * H * dv, dv, H * dv, 1}, options);
  }
  return empty_in_layout(s, dv, layout, options);
}

// `t` ([B, H, N, D]) in `layout`, copied only when it is not.
inline at::Tensor in_layout(const at::Tensor& t, Layout layout) {
  if (layout == Layout::kTokenMajor) return is_token_major(t) ? t : t.contiguous();
  return is_channel_first(t) ? t : t.transpose(2, 3).contiguous().transpose(2, 3);
}

// The gradient of an operand t ([B, H, N, D]): uninitialised, in `layout`, with t's heads in
// the dim that holds them in t (empty_output_like's rule), so that autograd's view back to t's
// base is free; e.g. AIFI's [B, N, H, D] head views get [B, N, H * D] gradients, not
// [B, H, N, D] ones that autograd then copies.
inline at::Tensor empty_grad_like(const at::Tensor& t, Layout layout) {
  const AttnShape s{t.size(0), t.size(1), t.size(2), t.size(3), t.size(3), layout};
  return empty_output_like(t, s, layout, t.options());
}

}  // namespace psa_fa2
