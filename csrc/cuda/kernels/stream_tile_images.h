// The layout of the Hopper backward's stream images (BwdParams::stream_tile_images): for each
// (batch, head) and each step of 64 query rows, one contiguous block holding what the step
// streams, in the order and swizzle of the kernel's shared stages, which one thread then fetches
// with bulk copies:
//   channel rows 0 .. dk - 1:           Q, 64 tokens each (the forward's K tile images' swizzle);
//   channel rows dk .. dk + dv - 1:     dO, likewise;
//   the next kStreamImageStatsRows rows: the rows' lse and D as float4s {lse[2m], lse[2m + 1],
//                                        D[2m], D[2m + 1]} for row pairs m = 0 .. 31.
// Rows past N are zero. The host copies Q and dO there (aligned_rows.h); the backward's
// preprocess writes the statistics.
#pragma once

#include <cstdint>

namespace psa_fa2 {

constexpr int kStreamImageTokens = 64;
// 64 rows x (lse, D) x 4 bytes = 512 bytes = four rows of 64 2-byte elements.
constexpr int kStreamImageStatsRows = 4;

constexpr int stream_image_channels(int dk, int dv) { return dk + dv + kStreamImageStatsRows; }
constexpr int64_t stream_image_step_bytes(int dk, int dv) {
  return int64_t(stream_image_channels(dk, dv)) * kStreamImageTokens * 2;
}
constexpr int64_t stream_image_stats_offset_bytes(int dk, int dv) {
  return int64_t(dk + dv) * kStreamImageTokens * 2;
}
constexpr int stream_image_steps(int n) { return (n + kStreamImageTokens - 1) / kStreamImageTokens; }

}  // namespace psa_fa2
