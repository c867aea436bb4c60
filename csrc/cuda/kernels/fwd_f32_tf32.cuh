// FlashAttention-2 forward for float32 inputs on TF32 tensor cores (mma.sync m16n8k8 .tf32,
// fp32 accumulate): what torch.get_float32_matmul_precision() "high" / "medium" allow, like
// cuBLAS's TF32 matmuls.
//
// The CTA shape, shared-memory tiles, copiers, pipeline and launcher are those of the exact
// kernel (fwd_f32_ffma.cuh): 8 warps x 16 query rows, K/V in kBlockN-token tiles
// through two cp.async stages, Q [dk][kBlockM], K [dk][kBlockN], V [kBlockN][dv] in shared
// memory. What differs:
//   - Channel-first V stays [dv][kBlockN], as global memory has it (16-byte copies instead of
//     transposing 4-byte ones; F32Traits::kVByChannel).
//   - Operands are rounded to TF32 (cvt.rna, round to nearest, ties away) once, in shared
//     memory: each thread rounds the elements its own cp.async wrote, after its wait and
//     before the barrier that publishes the tile. Eight warps read every K/V element, so
//     rounding at fragment load would cost 8x the conversions.
//   - S (16 x kBlockN per warp) and O (16 x dv) live in mma accumulator fragments. P feeds the
//     P V product from registers: the accumulator of an 8-key block holds, per lane, keys
//     2t, 2t+1 of rows g, g+8, and the A fragment of m16n8k8 wants k indices t, t+4. Since
//     P V sums over keys, A's k index t is taken to be key 2t and t+4 key 2t+1, and the V
//     fragment is read with the same order: b0 = V[key 2t][ch g], b1 = V[key 2t + 1][ch g],
//     adjacent in a [dv][kBlockN] tile (one 64-bit load).
//   - Key splits on small grids (FwdParams::kv_splits) as in the exact kernel: a CTA takes a
//     run of its row tile's key tiles and leaves its normalized output and row sum to
//     combine_kv_splits.
//   - The online softmax is the bf16 kernel's (mma_softmax.cuh: rows g, g+8 per lane, max
//     over the 4 lanes of a row), in base 2 with log2(e) folded into the scale, with a lazy
//     max (mma_softmax.cuh, kLazyMax): a row's reference max moves only when the max grows by
//     more than 2^8, so most tiles of a long row skip the rescale of O (probabilities reach 256
//     before the final normalisation; exact in fp32, and their TF32 roundings keep the same
//     relative error).
#pragma once

#include "fwd_f32_ffma.cuh"
#include "mma_softmax.cuh"

namespace psa_fa2 {
namespace flash_fwd_f32_detail {

__device__ __forceinline__ float round_to_tf32(float x) {
  uint32_t y;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(y) : "f"(x));
  return __uint_as_float(y);
}

__device__ __forceinline__ uint32_t tf32_bits(float x) { return __float_as_uint(round_to_tf32(x)); }

// D += A B for one 16x8x8 block (g = lane / 4, t = lane % 4):
//   A: a[0] = (row g, k t), a[1] = (row g+8, k t), a[2] = (row g, k t+4), a[3] = (row g+8, k t+4)
//   B: b0 = (k t, col g), b1 = (k t+4, col g)
//   C: c[0..1] = (row g, cols 2t, 2t+1), c[2..3] = (row g+8, cols 2t, 2t+1)
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lds_bits(const float* p) { return __float_as_uint(*p); }

template <int kDk, int kDv, Layout kLayout, int kVecBytes>
__global__ void __launch_bounds__(kThreads, (F32Traits<kDk, kDv, kLayout, kVecBytes, true>::kMinBlocks))
    flash_fwd_tf32_kernel(const __grid_constant__ FwdParams params, const float scale_log2) {
  using Tr = F32Traits<kDk, kDv, kLayout, kVecBytes, true>;
  constexpr bool kCF = Tr::kCF;
  constexpr int kBlockN = Tr::kBlockN;
  constexpr int kKSteps = kDk / 8;      // k8 steps of S = Q K^T
  constexpr int kSTiles = kBlockN / 8;  // n8 tiles of S per warp (= k8 steps of P V)
  constexpr int kOTiles = kDv / 8;      // n8 tiles of O per warp

  extern __shared__ __align__(16) float smem[];
  float* const sQ = smem + Tr::kQOff;
  float* const sK = smem + Tr::kKOff;
  float* const sV = smem + Tr::kVOff;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int N = params.seqlen;
  const int bh = block_bh<false>();
  const int b = bh / params.heads;
  const int h = bh % params.heads;
  // Key splits as in the exact kernel.
  const RowTileSplit tile = row_tile_split<false>(N);
  const int m0 = tile.m0;
  const auto [j_begin, j_end] = tile.key_tiles((N + kBlockN - 1) / kBlockN);

  const F32TileSources<Tr> src(params, b, h);
  auto to_tf32 = [](float& x) { x = round_to_tf32(x); };

  src.copy_q(sQ, m0, tid, params);
  src.copy_kv(sK + (j_begin & 1) * Tr::kKFloats, sV + (j_begin & 1) * Tr::kVFloats,
              j_begin * kBlockN, tid, params);
  cp_async_commit();

  float o[kOTiles][4];
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Running max (scaled log2 units) of rows g and g+8, and this lane's partial row sums
  // (reduced over the 4 lanes of a row at the end; all four apply the same rescales).
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  const float* const sQw = sQ + warp * kRowsPerWarp + g;

  for (int j = j_begin; j < j_end; ++j) {
    const int stage = j & 1;
    const int n0 = j * kBlockN;
    float* const sKs = sK + stage * Tr::kKFloats;
    float* const sVs = sV + stage * Tr::kVFloats;
    // Tile j landed; round what this thread copied, then the barrier publishes it (and tells
    // that every warp is done with tile j - 1, whose stage is refilled next).
    cp_async_wait<0>();
    if (j == j_begin) Tr::q_copier(tid, params).for_each_copied(sQ, to_tf32);
    Tr::k_copier(tid, params).for_each_copied(sKs, to_tf32);
    Tr::v_copier(tid, params).for_each_copied(sVs, to_tf32);
    __syncthreads();
    if (j + 1 < j_end) {
      src.copy_kv(sK + (stage ^ 1) * Tr::kKFloats, sV + (stage ^ 1) * Tr::kVFloats,
                  n0 + kBlockN, tid, params);
    }
    cp_async_commit();

    // ---- S = Q K^T ----
    float s[kSTiles][4];
#pragma unroll
    for (int i = 0; i < kSTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const float* q_lo = sQw + (kk * 8 + t) * Tr::kQStride;
      const float* q_hi = q_lo + 4 * Tr::kQStride;
      const uint32_t a[4] = {lds_bits(q_lo), lds_bits(q_lo + 8), lds_bits(q_hi), lds_bits(q_hi + 8)};
      const float* k_lo = sKs + (kk * 8 + t) * Tr::kKStride + g;
      const float* k_hi = k_lo + 4 * Tr::kKStride;
#pragma unroll
      for (int i = 0; i < kSTiles; ++i) mma_1688_tf32(s[i], a, lds_bits(k_lo + i * 8), lds_bits(k_hi + i * 8));
    }

    // ---- Keys past N -inf, then the online softmax (mma_softmax.cuh; lazy max) ----
    mma_softmax::mask_keys_from(s, n0, N, t);
    mma_softmax::online_softmax_tile<kSTiles, kOTiles, true>(s, row_max, row_sum, o, scale_log2);

    // ---- O += P V (8-key block i of P is S tile i; key order 2t, 2t+1 <-> k t, t+4) ----
#pragma unroll
    for (int i = 0; i < kSTiles; ++i) {
      const uint32_t a[4] = {tf32_bits(s[i][0]), tf32_bits(s[i][2]), tf32_bits(s[i][1]),
                             tf32_bits(s[i][3])};
      if constexpr (Tr::kVByChannel) {
        // V [dv][key]: keys 2t, 2t + 1 of channel c * 8 + g in one 64-bit load.
        const float* v_ch = sVs + g * Tr::kVStride + i * 8 + 2 * t;
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) {
          const float2 b = *reinterpret_cast<const float2*>(v_ch + c * 8 * Tr::kVStride);
          mma_1688_tf32(o[c], a, __float_as_uint(b.x), __float_as_uint(b.y));
        }
      } else {
        const float* v_lo = sVs + (i * 8 + 2 * t) * Tr::kVStride + g;
        const float* v_hi = v_lo + Tr::kVStride;
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) mma_1688_tf32(o[c], a, lds_bits(v_lo + c * 8), lds_bits(v_hi + c * 8));
      }
    }
  }
  cp_async_wait<0>();  // only empty groups are left

  // ---- Epilogue ----
  const int bh_e = block_bh<true>();
  const int b_e = bh_e / params.heads;
  const int h_e = bh_e % params.heads;
  const RowTileSplit tile_e = row_tile_split<true>(N);
  const int splits_e = tile_e.splits, m0_e = tile_e.m0;
  const SplitPart part =
      splits_e > 1 ? split_part(params, tile_e, bh_e) : SplitPart{nullptr, nullptr};
  float* const out_head =
      static_cast<float*>(params.out.ptr) + b_e * params.out.stride_b + h_e * params.out.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // l == 0 only for rows whose scores are all -inf: 0 * inf = NaN, as eager softmax gives.
    const float inv_l = 1.f / l;
    const int n = m0_e + warp * kRowsPerWarp + g + 8 * r;
    if (n >= N) continue;
    if (splits_e > 1) {
      // This split's row sum (log2 units) and normalized output ([c][n] per (batch, head)),
      // for combine_kv_splits.
      if (t == 0) part.lse2[n] = row_max[r] + log2f(l);
      float* const o_part = part.out + n;
#pragma unroll
      for (int c = 0; c < kOTiles; ++c) {
        const int ch = c * 8 + 2 * t;
        o_part[static_cast<int64_t>(ch) * N] = o[c][2 * r] * inv_l;
        o_part[static_cast<int64_t>(ch + 1) * N] = o[c][2 * r + 1] * inv_l;
      }
      continue;
    }
    if (t == 0) {
      // lse = ln(sum_j exp(scale * s_j)) = ln2 * (m + log2(l)), m in scaled log2 units.
      static_cast<float*>(params.lse)[static_cast<int64_t>(bh_e) * N + n] =
          (row_max[r] + log2f(l)) * 0.6931471805599453f;
    }
#pragma unroll
    for (int c = 0; c < kOTiles; ++c) {
      const int ch = c * 8 + 2 * t;
      const float x0 = o[c][2 * r] * inv_l, x1 = o[c][2 * r + 1] * inv_l;
      if constexpr (kCF) {
        // out[ch][n]: the 8 lanes of one t write 8 consecutive tokens.
        out_head[ch * params.out.stride_d + n] = x0;
        out_head[(ch + 1) * params.out.stride_d + n] = x1;
      } else {
        float* dst = out_head + n * params.out.stride_n + ch;
        if constexpr (kVecBytes == 16) {
          *reinterpret_cast<float2*>(dst) = make_float2(x0, x1);  // 8-byte aligned: ch even
        } else {
          dst[0] = x0;
          dst[1] = x1;
        }
      }
    }
  }
}

}  // namespace flash_fwd_f32_detail
}  // namespace psa_fa2
