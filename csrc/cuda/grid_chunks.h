// Every kernel's grid is (row or key tiles, B * H), and CUDA caps a grid's y dimension at
// 65535. A call with more (b, h) pairs runs as several launches: each on a run of whole
// batches, or, where one batch alone has more heads than that, on a run of one batch's heads.
// Each launch is planned and carried out as a call of its own (launch.cpp), so a call within
// the cap, every YOLO shape, runs exactly as it would without this, and every kernel keeps
// its (b, h) arithmetic in 32 bits.
#pragma once

#include <algorithm>
#include <cstdint>

namespace psa_fa2 {

constexpr int64_t kMaxGridY = 65535;

// Batches [batch0, batch0 + batches) x heads [head0, head0 + heads) of a [B, H, ...] call.
struct GridChunk {
  int64_t batch0, batches, head0, heads;
  bool whole;  // the whole call: one launch
};

// Calls fn(const GridChunk&) for each launch of a call of B batches of H heads, in order.
template <class Fn>
void for_each_grid_chunk(int64_t B, int64_t H, Fn&& fn) {
  if (B * H <= kMaxGridY) {
    fn(GridChunk{0, B, 0, H, true});
  } else if (H <= kMaxGridY) {
    const int64_t per_launch = kMaxGridY / H;
    for (int64_t b = 0; b < B; b += per_launch) fn(GridChunk{b, std::min(per_launch, B - b), 0, H, false});
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; h += kMaxGridY) fn(GridChunk{b, 1, h, std::min(kMaxGridY, H - h), false});
  }
}

// How many launches a call of B batches of H heads takes, and the first one.
inline int64_t grid_chunk_count(int64_t B, int64_t H) {
  if (B * H <= kMaxGridY) return 1;
  if (H <= kMaxGridY) return (B + kMaxGridY / H - 1) / (kMaxGridY / H);
  return B * ((H + kMaxGridY - 1) / kMaxGridY);
}
inline GridChunk first_grid_chunk(int64_t B, int64_t H) {
  if (B * H <= kMaxGridY) return {0, B, 0, H, true};
  if (H <= kMaxGridY) return {0, std::min(kMaxGridY / H, B), 0, H, false};
  return {0, 1, 0, kMaxGridY, false};
}

}  // namespace psa_fa2
