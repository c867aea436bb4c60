// The forward kernels' online softmax on a warp's score block held in mma accumulator
// fragments: 16 query rows x (8 * kTiles) keys, lane (g = lane / 4, t = lane % 4) holding
// s[i][0..1] = row g, keys 8i + 2t, 8i + 2t + 1 and s[i][2..3] = the same keys of row g + 8
// (the C layout of mma.sync m16n8kK, whatever the input type). Shared by the bf16 / fp16
// kernels (fwd_sm80.cuh, and fwd_sm90.cuh's wgmma accumulators, which have the same layout)
// and the TF32 one (fwd_f32_tf32.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "mma_sync_ptx.cuh"

namespace psa_fa2 {
namespace mma_softmax {

// 2^x on the MUFU (mma_sync_ptx.cuh); the backward kernels recompute their probabilities
// with it too.
using ptx::ex2;

// v[0] op v[1] op ... op v[kCount - 1] as a tree (depth log2(kCount)) rather than a chain; the
// partial results are left in v.
template <int kCount, class Op>
__device__ __forceinline__ float reduce_tree(float (&v)[kCount], Op op) {
#pragma unroll
  for (int w = 1; w < kCount; w *= 2) {
#pragma unroll
    for (int i = 0; i + w < kCount; i += 2 * w) v[i] = op(v[i], v[i + w]);
  }
  return v[0];
}

// Keys at or past n get -inf before the max, so weight 0: the last tile of a sequence.
template <int kTiles>
__device__ __forceinline__ void mask_keys_past(float (&s)[kTiles][4], int n0, int n, int t) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int col = n0 + i * 8 + 2 * t;
    if (col >= n) s[i][0] = s[i][2] = -INFINITY;
    if (col + 1 >= n) s[i][1] = s[i][3] = -INFINITY;
  }
}

// The same, skipped (one branch) for tiles that end before n.
template <int kTiles>
__device__ __forceinline__ void mask_keys_from(float (&s)[kTiles][4], int n0, int n, int t) {
  if (n0 + 8 * kTiles > n) mask_keys_past(s, n0, n, t);
}

// One key tile of the online softmax, base 2: turns the raw scores s into probabilities
// p = 2^(s * scale_log2 - m) against the updated running max m of each row (row_max, in
// scaled log2 units) and adds them to this lane's partial row sums (row_sum; the 4 lanes of a
// row see the same max, so their partial sums are reduced once, at the end). alpha receives
// the factors 2^(m_old - m_new) by which the output accumulator of rows g and g + 8 must be
// rescaled (rescale_rows). The max is taken on raw scores and scaled once, which needs
// scale >= 0 (checked on the host); each probability is then one FFMA + one MUFU ex2.
//
// kLazyMax: the reference max only moves when the row max grows by more than kLazyMaxSlack
// (log2 units), so most tiles of a long row keep alpha = 1 and can skip the rescale. The
// probabilities are then up to 2^kLazyMaxSlack = 256 instead of 1. Only the TF32 forward uses
// it: rounded to 16 bits for P V, a row's largest probability is no longer exact (it is 1
// under the exact max), which doubled the 16-bit forwards' output error (docs/numerics.md).
constexpr float kLazyMaxSlack = 8.f;

// Row r (0: g, 1: g + 8) of softmax_probabilities' first half: the row's new running max, the
// factor alpha of the old one and the offset neg_m that its exponentials add.
template <int kTiles, bool kLazyMax>
__device__ __forceinline__ void update_row_max(const float (&s)[kTiles][4], int r,
                                               float (&row_max)[2], float scale_log2,
                                               float (&alpha)[2], float (&neg_m)[2]) {
  // The row max is on the critical path from S to the exps: a tree (depth log2(2 kTiles))
  // rather than a chain. fmaxf drops NaN operands, so with the final -inf it gives what a
  // chain from -inf gives, NaN scores included.
  float m[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) m[i] = fmaxf(s[i][2 * r], s[i][2 * r + 1]);
  float mx = fmaxf(reduce_tree(m, [](float a, float b) { return fmaxf(a, b); }), -INFINITY);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  float m_new = fmaxf(row_max[r], mx * scale_log2);
  if constexpr (kLazyMax) {
    if (m_new - row_max[r] <= kLazyMaxSlack) m_new = row_max[r];  // -inf - -inf = NaN: moves
  }
  // A row whose scores so far are all -inf would give (-inf) - (-inf) = NaN below; use 0 as
  // the reference then, so such keys get weight 0 like in eager softmax. NaN scores are not
  // affected (fmaxf skips them, ex2(NaN) stays NaN) and still poison the row as in eager.
  const float m_ref = m_new == -INFINITY ? 0.f : m_new;
  alpha[r] = ex2(row_max[r] - m_ref);  // 0 on the first tile (row_max = -inf)
  row_max[r] = m_new;
  neg_m[r] = -m_ref;
}

// Its second half: row r of s becomes 2^(s * scale_log2 + neg_m); returns this lane's sum of it,
// accumulated in order (from the first pair: 0 + x would be one more dependent FADD, and gives
// x for every x >= +0) or, with kSumTree, as a tree (depth log2(2 kTiles) instead of kTiles
// dependent FADDs; the kernels measure which suits them).
template <int kTiles, bool kSumTree = false>
__device__ __forceinline__ float exponentiate_row(float (&s)[kTiles][4], int r, float neg_m,
                                                  float scale_log2) {
  float sum[kTiles];  // the pairs' sums for the tree; sum[0] alone for the chain
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    s[i][2 * r] = ex2(fmaf(s[i][2 * r], scale_log2, neg_m));
    s[i][2 * r + 1] = ex2(fmaf(s[i][2 * r + 1], scale_log2, neg_m));
    const float pair = s[i][2 * r] + s[i][2 * r + 1];
    if constexpr (kSumTree) {
      sum[i] = pair;
    } else {
      sum[0] = i == 0 ? pair : sum[0] + pair;
    }
  }
  if constexpr (kSumTree) reduce_tree(sum, [](float a, float b) { return a + b; });
  return sum[0];
}

template <int kTiles, bool kLazyMax = false, bool kSumTree = false>
__device__ __forceinline__ void softmax_probabilities(float (&s)[kTiles][4], float (&row_max)[2],
                                                      float (&row_sum)[2], float scale_log2,
                                                      float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float neg_m[2];
    update_row_max<kTiles, kLazyMax>(s, r, row_max, scale_log2, alpha, neg_m);
    row_sum[r] = row_sum[r] * alpha[r] +
                 exponentiate_row<kTiles, kSumTree>(s, r, neg_m[r], scale_log2);
  }
}

// Rows g and g + 8 of an accumulator of C fragments (16 rows x 8 * kOTiles) times alpha.
template <int kOTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kOTiles][4], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) {
    o[i][0] *= alpha[0];
    o[i][1] *= alpha[0];
    o[i][2] *= alpha[1];
    o[i][3] *= alpha[1];
  }
}

// Both, for kernels whose accumulator is not in flight during the softmax: one rescale of
// the accumulator per tile, or with kLazyMax only for tiles that move the max of some row of
// the warp (alpha is exactly 1 where it stays: 2^0).
template <int kTiles, int kOTiles, bool kLazyMax = false>
__device__ __forceinline__ void online_softmax_tile(float (&s)[kTiles][4], float (&row_max)[2],
                                                    float (&row_sum)[2], float (&o)[kOTiles][4],
                                                    float scale_log2) {
  float alpha[2];
  softmax_probabilities<kTiles, kLazyMax>(s, row_max, row_sum, scale_log2, alpha);
  if (!kLazyMax || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
    rescale_rows(o, alpha);
}

}  // namespace mma_softmax
}  // namespace psa_fa2
