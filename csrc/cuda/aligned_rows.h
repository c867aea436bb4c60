// Copies of channel-first tensors for the Hopper kernels, made where the plan (plan.cpp) asks:
// to rows that start at 128-byte multiples (K and V for the forward, Q and dO for the backward),
// or K and V to the forward's tile images, or Q and dO to the backward's stream images. The
// block's views have rows N elements apart: at
// N % 8 != 0 that holds the kernels' copies of them to 8, 4 or 2 bytes, and at N % 64 != 0
// their tiles straddle 128-byte lines.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "kernels/launchers.h"
#include "kernels/stream_tile_images.h"

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

// The copies' rows are padded to 64 tokens: 128 bytes, so that each 64-token tile of a row is
// one aligned 128-byte line. Rows padded only to 8 tokens (16 bytes) measured clearly slower
// (bench/tune/row_stride.py).
constexpr int64_t kAlignedRowTokens = 64;

inline int64_t aligned_row_tokens(int64_t n) {
  return (n + kAlignedRowTokens - 1) / kAlignedRowTokens * kAlignedRowTokens;
}

// Channel-first [B, H, N, d_i] tensors (2-byte elements; the same B, H, N) copied one after the
// other into one buffer [B, H, sum d_i, aligned_row_tokens(N)] on `stream`, given as
// (tensor, channels to copy from it) pairs: the channels of a part may run on into the next
// tensor's (v_follows_k), which one copy then covers. Returns the channel-first [B, H, N, d_i]
// views of the buffer that stand for the tensors (the padding past N is never read).
inline std::vector<at::Tensor> aligned_rows_copy(
    std::initializer_list<std::pair<at::Tensor, int64_t>> parts,
    std::initializer_list<int64_t> dims, cudaStream_t stream) {
  const at::Tensor& first = parts.begin()->first;
  const int64_t B = first.size(0), H = first.size(1), N = first.size(2);
  int64_t channels = 0;
  for (int64_t d : dims) channels += d;
  const int64_t padded = aligned_row_tokens(N);
  const at::Tensor buffer = at::empty({B, H, channels, padded}, first.options());
  int64_t channel0 = 0;
  for (const auto& [src, count] : parts) {
    const RowCopy c{src.data_ptr(), src.stride(0), src.stride(1), src.stride(3),
                    buffer.data_ptr(), padded, channels, channel0, B, H, count, N};
    copy_rows(c, stream);
    channel0 += count;
  }
  const at::Tensor rows = buffer.narrow(3, 0, N).transpose(2, 3);  // [B, H, N, channels]
  std::vector<at::Tensor> views;
  channel0 = 0;
  for (int64_t d : dims) {
    views.push_back(rows.narrow(3, channel0, d));
    channel0 += d;
  }
  return views;
}

// k [B, H, N, dk] and v [B, H, N, dv] (channel-first, 2-byte elements) on aligned rows: one
// copy for the block's split views, two for separate tensors.
inline std::pair<at::Tensor, at::Tensor> aligned_kv_copy(const at::Tensor& k, const at::Tensor& v,
                                                         cudaStream_t stream) {
  const int64_t dk = k.size(3), dv = v.size(3);
  const std::vector<at::Tensor> views =
      v_follows_k(k, v) ? aligned_rows_copy({{k, dk + dv}}, {dk, dv}, stream)
                        : aligned_rows_copy({{k, dk}, {v, dv}}, {dk, dv}, stream);
  return {views[0], views[1]};
}

// Copies `count` channels of src (channel-first [B, H, N, d], 2-byte elements) into channels
// channel0 .. of tile images [B * H, ceil(N / 64), channels, 64] (RowCopy's tiled mode: each
// 64-token tile of a channel swizzled as the Hopper kernels' shared stages hold it, zero past N).
inline void copy_to_tile_images(const at::Tensor& src, int64_t count, int64_t channel0,
                                const at::Tensor& images, cudaStream_t stream) {
  RowCopy c{src.data_ptr(), src.stride(0), src.stride(1), src.stride(3), images.data_ptr(), 0,
            images.size(2), channel0, src.size(0), src.size(1), count, src.size(2)};
  c.tile_tokens = images.size(3);
  copy_rows(c, stream);
}

// k [B, H, N, dk] and v [B, H, N, dv] (channel-first, 2-byte elements) as the Hopper forward's
// tile images: [B * H, ceil(N / 64), dk + dv, 64], each 64-key tile K's rows then V's.
constexpr int64_t kTileImageTokens = 64;

inline at::Tensor kv_tile_images_copy(const at::Tensor& k, const at::Tensor& v,
                                      cudaStream_t stream) {
  const int64_t B = k.size(0), H = k.size(1), N = k.size(2), dk = k.size(3), dv = v.size(3);
  const int64_t tiles = (N + kTileImageTokens - 1) / kTileImageTokens;
  const at::Tensor images = at::empty({B * H, tiles, dk + dv, kTileImageTokens}, k.options());
  if (v_follows_k(k, v)) {
    copy_to_tile_images(k, dk + dv, 0, images, stream);
  } else {
    copy_to_tile_images(k, dk, 0, images, stream);
    copy_to_tile_images(v, dv, dk, images, stream);
  }
  return images;
}

// q [B, H, N, dk] and dout [B, H, N, dv] (channel-first, 2-byte elements) as the Hopper
// backward's stream images (stream_tile_images.h): [B * H, ceil(N / 64), dk + dv + 4, 64], each
// step's Q rows then dO's, zero past N. The lse / D rows are left to the backward's preprocess.
inline at::Tensor stream_tile_images_copy(const at::Tensor& q, const at::Tensor& dout,
                                          cudaStream_t stream) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), dk = q.size(3), dv = dout.size(3);
  const at::Tensor images =
      at::empty({B * H, stream_image_steps(int(N)), stream_image_channels(int(dk), int(dv)),
                 kStreamImageTokens},
                q.options());
  copy_to_tile_images(q, dk, 0, images, stream);
  copy_to_tile_images(dout, dv, dk, images, stream);
  return images;
}

}  // namespace psa_fa2
