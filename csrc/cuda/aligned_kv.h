// Copies of channel-first K and V on rows that start at 16-byte multiples, for the forward's
// dispatch (flash_fwd_wants_aligned_kv): at N % 8 != 0 the block's views have rows N elements
// apart, which holds the kernels' K / V copies to 8, 4 or 2 bytes.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <utility>

#include "launchers.h"

namespace psa_fa2 {

// v starts right after k's dk channels, with k's strides: the block's split views of one
// qkv tensor, which one copy covers.
inline bool v_follows_k(const at::Tensor& k, const at::Tensor& v) {
  if (!k.is_alias_of(v) || k.strides() != v.strides() ||
      k.sizes().slice(0, 3) != v.sizes().slice(0, 3))
    return false;
  const auto* k_bytes = static_cast<const char*>(k.data_ptr());
  const auto* v_bytes = static_cast<const char*>(v.data_ptr());
  return v_bytes == k_bytes + k.size(3) * k.stride(3) * k.element_size();
}

// k [B, H, N, dk] and v [B, H, N, dv] (channel-first, 2-byte elements) copied into one buffer
// [B, H, dk + dv, N rounded up to 8 tokens] on `stream`; returns the channel-first views of it
// that stand for them (the padding past N is zeros and never read).
inline std::pair<at::Tensor, at::Tensor> aligned_kv_copy(const at::Tensor& k, const at::Tensor& v,
                                                         cudaStream_t stream) {
  const int64_t B = k.size(0), H = k.size(1), N = k.size(2), dk = k.size(3), dv = v.size(3);
  const int64_t padded = (N + 7) / 8 * 8;
  const at::Tensor buffer = at::empty({B, H, dk + dv, padded}, k.options());
  auto copy = [&](const at::Tensor& src, int64_t channels, int64_t channel0) {
    const RowCopy c{src.data_ptr(), src.stride(0), src.stride(1), src.stride(3),
                    buffer.data_ptr(), padded, dk + dv, channel0, B, H, channels, N};
    copy_rows(c, stream);
  };
  if (v_follows_k(k, v)) {
    copy(k, dk + dv, 0);
  } else {
    copy(k, dk, 0);
    copy(v, dv, dk);
  }
  const at::Tensor rows = buffer.narrow(3, 0, N).transpose(2, 3);  // [B, H, N, dk + dv]
  return {rows.narrow(3, 0, dk), rows.narrow(3, dk, dv)};
}

}  // namespace psa_fa2
