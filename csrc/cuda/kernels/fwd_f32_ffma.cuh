// FlashAttention-2 forward for float32 inputs.
//
//   kTf32 = false (torch.get_float32_matmul_precision() == "highest"): exact fp32, FFMA (SIMT),
//                 this file.
//   kTf32 = true  (otherwise): S = Q K^T and O += P V on mma.sync m16n8k8 .tf32 tensor cores,
//                 fwd_f32_tf32.cuh; it shares this file's tiles, copiers and launcher.
//
// One CTA = 8 warps computes kBlockM = 128 query rows of one (batch, head); warp w owns rows
// [16w, 16w + 16) for the whole kernel, so the softmax row statistics and the P tile never leave
// the warp (shuffles + a warp-private P buffer, no CTA barrier for them). K/V stream in kBlockN-token
// tiles through two shared-memory stages filled with cp.async one tile ahead (one __syncthreads per
// tile). Online softmax in base 2 (log2(e) folded into the scale), fp32 statistics, exp2f.
//
// Grids of fewer CTAs than SMs (1,4,400 is 16 CTAs) split each row tile's key tiles among as
// many CTAs as fit the SMs once over (FwdParams::kv_splits, up to kMaxKvSplits), in both
// kernels: each leaves its normalized output and row sum in scratch, and combine_kv_splits
// weights them by their row sums into out and lse. Without the splits most SMs would sit idle
// while a few CTAs each ran a row tile's whole key loop.
//
// Shared-memory tiles are stored in one canonical orientation whatever the global layout, every row
// padded by kPad = 4 floats (keeps 16-byte alignment, and makes transposing 4-byte writes conflict
// free, see TransposeCopier; the TF32 path pads Q and K rows by 8, see F32Traits::kQKPad):
//   Q  [dk][kBlockM]   K [dk][kBlockN]   V [kBlockN][dv]   P (per warp) [kBlockN][16]
// except that the TF32 path keeps channel-first V as [dv][kBlockN] (F32Traits::kVByChannel).
// A tile whose unit-stride global dimension is the smem row (channel-first Q/K, token-major V) is
// copied with cp.async of kVecBytes = 16 or 4 (the plan, plan.cpp, picks it from the real
// alignment); the others (token-major Q/K, and channel-first V in the exact path) are transposed
// on the fly with 4-byte cp.async.
// Either way a tile is < 1% of the instructions of its arithmetic.
//
// FFMA micro-tiles (exact path): lane = 4 * tx + ty (tx = 0..7, ty = 0..3). A thread owns rows
// 16w + 4ty + {0..3} and, of a width-W dimension (keys of S, channels of O), the W/8 columns
// mcol(tx, j) = 32 (j / 4) + 4 tx + j % 4 (W >= 32) or 2 tx + j (W = 16). Per k step it loads one
// float4 of Q (or P) and W/32 float4 of K (or V): each LDS.128 touches <= 128 distinct bytes.
//
// Only CUDA headers and attention_params.h are included.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../attention_params.h"
#include "kv_split_scratch.h"
#include "launch_util.h"
#include "launchers.h"
#include "mma_sync_ptx.cuh"

namespace psa_fa2 {
namespace flash_fwd_f32_detail {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;
constexpr int kBlockM = kWarps * kRowsPerWarp;  // 128
static_assert(kBlockM == kF32FwdRowsPerCta, "the dispatch plans key splits with kBlockM");
constexpr int kPad = 4;                          // floats of padding per smem row
constexpr int kPStride = kRowsPerWarp + kPad;    // 20: P rows, see store_p

// Unroll factor of the k loops (a fully unrolled (32, 64) tile is ~3.5k instructions, more
// than the instruction caches like).
// dv = 128 holds 64 accumulators per thread; ptxas allocates it without spills at 32 (4, 8 and
// 16 spill a few registers).
template <int kDv>
constexpr int kUnroll = kDv >= 128 ? 32 : 8;

// ---------------------------------------------------------------------------------------------
// Memory helpers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float4 lds128(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float2 lds64(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void sts128(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// The MUFU exp2 and cp.async (mma_sync_ptx.cuh).
using ptx::cp_async;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ex2;

// This CTA's (batch * heads + head) index. The epilogue re-reads it with opaque moves, so that
// b and h are recomputed there rather than kept live (spilled) across the main loop.
template <bool kOpaque>
__device__ __forceinline__ int block_bh() {
  if constexpr (kOpaque) {
    uint32_t y;
    asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(y));
    return static_cast<int>(y);
  } else {
    return blockIdx.y;
  }
}
// The CTA's key split count, its split and its first query row (FwdParams::kv_splits; the grid
// is that many times the row tiles, CTA blockIdx.x = row tile * splits + split), from
// blockIdx.x and gridDim.x, likewise re-read opaquely in the epilogue.
struct RowTileSplit {
  int splits, split, m0;
  // The split's key tiles [first, last) of the row's n_tiles (at least one: the plan keeps
  // splits <= n_tiles).
  __device__ __forceinline__ int2 key_tiles(int n_tiles) const {
    return {split * n_tiles / splits, (split + 1) * n_tiles / splits};
  }
};
template <bool kOpaque>
__device__ __forceinline__ RowTileSplit row_tile_split(int seqlen) {
  uint32_t x = blockIdx.x, nx = gridDim.x;
  if constexpr (kOpaque) {
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
    asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(nx));
  }
  const int splits = static_cast<int>(nx) / ((seqlen + kBlockM - 1) / kBlockM);
  return {splits, static_cast<int>(x) % splits, static_cast<int>(x) / splits * kBlockM};
}

// ---------------------------------------------------------------------------------------------
// Tile copiers. A tile is kRows x kCols floats in shared memory, row stride kCols + kRowPad.
// `valid` = tokens left from the tile start; tokens run along the columns (Q, K) or the rows (V).
// Out-of-range elements read nothing (src-size 0) and point at gtile, which is always valid.
// ---------------------------------------------------------------------------------------------

// Global element (r, c) at gtile + r * row_stride + c: vectors of kVecBytes along the row.
template <int kRows, int kCols, int kVecBytes, bool kTokensAlongCols, int kRowPad = kPad>
struct DirectCopier {
  static constexpr int kE = kVecBytes / 4;
  static constexpr int kVecsPerRow = kCols / kE;
  static constexpr int kRowStep = kThreads / kVecsPerRow;
  static constexpr int kPerThread = kRows / kRowStep;
  static constexpr int kStride = kCols + kRowPad;
  static_assert(kCols % kE == 0 && kThreads % kVecsPerRow == 0 && kRows % kRowStep == 0,
                "every thread copies the same number of vectors");

  int64_t goff, gstep;
  int soff, row0, col0;

  __device__ __forceinline__ DirectCopier(int tid, int64_t row_stride) {
    row0 = tid / kVecsPerRow;
    col0 = (tid % kVecsPerRow) * kE;
    goff = row0 * row_stride + col0;
    gstep = kRowStep * row_stride;
    soff = row0 * kStride + col0;
  }

  __device__ __forceinline__ void copy(float* stile, const float* gtile, int valid) const {
    int cols_bytes = kVecBytes;
    if constexpr (kTokensAlongCols) {
      const int left = valid - col0;
      cols_bytes = left >= kE ? kVecBytes : (left > 0 ? left * 4 : 0);
    }
    const float* src = gtile + goff;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int bytes =
          kTokensAlongCols ? cols_bytes : (row0 + i * kRowStep < valid ? kVecBytes : 0);
      cp_async<kVecBytes>(stile + soff + i * kRowStep * kStride, bytes > 0 ? src : gtile, bytes);
      src += gstep;
    }
  }

  // f(element) for every element this thread's copy() wrote (valid or zero-filled), one
  // shared-memory load and store per vector (ptxas does not merge the scalar ones).
  template <class F>
  __device__ __forceinline__ void for_each_copied(float* stile, F f) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      float* const p = stile + soff + i * kRowStep * kStride;
      if constexpr (kE == 4) {
        float4 x = *reinterpret_cast<float4*>(p);  // 16-byte aligned: kStride, col0 % 4 == 0
        f(x.x), f(x.y), f(x.z), f(x.w);
        *reinterpret_cast<float4*>(p) = x;
      } else {
        f(*p);
      }
    }
  }
};

// Global element (r, c) at gtile + r + c * col_stride (unit stride down a column): 4-byte copies,
// a warp takes 8 consecutive rows (32 contiguous bytes) of 4 columns. Shared address
// r * (kCols + 4) + c falls in bank 4r + c (mod 32) for kCols % 32 == 0 (and in 32 distinct banks
// for kCols = 16), so the transposing writes are conflict free (2-way with kRowPad = 8).
template <int kRows, int kCols, bool kTokensAlongCols, int kRowPad = kPad>
struct TransposeCopier {
  static constexpr int kWarpsC = (kCols / 4) < kWarps ? (kCols / 4) : kWarps;
  static constexpr int kWarpsR = kWarps / kWarpsC;
  static constexpr int kPassR = 8 * kWarpsR;
  static constexpr int kPassC = 4 * kWarpsC;
  static constexpr int kItR = kRows / kPassR;
  static constexpr int kItC = kCols / kPassC;
  static constexpr int kStride = kCols + kRowPad;
  static_assert(kWarps % kWarpsC == 0 && kRows % kPassR == 0 && kCols % kPassC == 0,
                "every thread copies the same number of elements");

  int64_t goff, cstep;
  int soff, row0, col0;

  __device__ __forceinline__ TransposeCopier(int tid, int64_t col_stride) {
    const int warp = tid / 32, lane = tid % 32;
    row0 = (warp / kWarpsC) * 8 + lane % 8;
    col0 = (warp % kWarpsC) * 4 + lane / 8;
    goff = row0 + col0 * col_stride;
    cstep = kPassC * col_stride;
    soff = row0 * kStride + col0;
  }

  __device__ __forceinline__ void copy(float* stile, const float* gtile, int valid) const {
    const float* src = gtile + goff;
#pragma unroll
    for (int c = 0; c < kItC; ++c) {
      const bool col_ok = !kTokensAlongCols || col0 + c * kPassC < valid;
#pragma unroll
      for (int r = 0; r < kItR; ++r) {
        const bool ok = col_ok && (kTokensAlongCols || row0 + r * kPassR < valid);
        cp_async<4>(stile + soff + r * kPassR * kStride + c * kPassC, ok ? src + r * kPassR : gtile,
                    ok ? 4 : 0);
      }
      src += cstep;
    }
  }

  // f(element) for every element this thread's copy() wrote (valid or zero-filled).
  template <class F>
  __device__ __forceinline__ void for_each_copied(float* stile, F f) const {
#pragma unroll
    for (int c = 0; c < kItC; ++c)
#pragma unroll
      for (int r = 0; r < kItR; ++r) f(stile[soff + r * kPassR * kStride + c * kPassC]);
  }
};

// ---------------------------------------------------------------------------------------------
// FFMA micro-tile columns (see the file comment)
// ---------------------------------------------------------------------------------------------
template <int kCount>
__device__ __forceinline__ int mcol(int tx, int j) {
  static_assert(kCount % 4 == 0 || kCount == 2, "micro-tile widths");
  if constexpr (kCount >= 4) {
    return (j / 4) * 32 + tx * 4 + (j % 4);
  } else {
    return tx * kCount + j;
  }
}
template <int kCount>
__device__ __forceinline__ void load_cols(float (&dst)[kCount], const float* row, int tx) {
  if constexpr (kCount >= 4) {
#pragma unroll
    for (int q = 0; q < kCount / 4; ++q) {
      const float4 v = lds128(row + q * 32 + tx * 4);
      dst[4 * q] = v.x;
      dst[4 * q + 1] = v.y;
      dst[4 * q + 2] = v.z;
      dst[4 * q + 3] = v.w;
    }
  } else {
    const float2 v = lds64(row + tx * 2);
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

// ---------------------------------------------------------------------------------------------
// Traits
// ---------------------------------------------------------------------------------------------
template <int kDk, int kDv, Layout kLayout, int kVecBytes, bool kTf32>
struct F32Traits {
  static_assert(kDk % 8 == 0 && kDv % 16 == 0 && kDk >= 8, "head dims");
  static_assert(kVecBytes == 16 || kVecBytes == 4, "access widths");
  static constexpr bool kCF = kLayout == Layout::kChannelFirst;
  // 64 keys per tile while the K/V stages stay small; 32 above dk + dv = 96, which keeps
  // (64, 64) and (64, 128) at two CTAs per SM (and the S micro-tile at 16 registers).
  static constexpr int kBlockN = (kDk + kDv <= 96) ? 64 : 32;
  static_assert(kBlockN <= kF32FwdMaxKeysPerTile, "the dispatch's key splits need a tile each");
  static constexpr int kTN = kBlockN / 8;  // S columns per thread (FFMA path)
  static constexpr int kTV = kDv / 8;      // O columns per thread (FFMA path)

  // The TF32 path reads Q and K as mma fragments, element (d = k0 + t, row or key = g) per
  // lane (t = lane % 4, g = lane / 4): 8 floats of padding put those in banks 8t + g, all
  // distinct (4 would give 4t + g, two-way conflicts). Its V reads (key 2t, channel g) are
  // conflict free with 4.
  static constexpr int kQKPad = kTf32 ? 8 : kPad;
  static constexpr int kQStride = kBlockM + kQKPad;
  static constexpr int kKStride = kBlockN + kQKPad;
  // The TF32 path keeps channel-first V as global memory has it, [dv][kBlockN] (copied with
  // kVecBytes, not transposed 4 bytes at a time): a lane's two keys 2t, 2t+1 of channel g are
  // then adjacent, one 64-bit load. 8 floats of padding put the 16 lanes of a load phase
  // (g < 4 or g >= 4) on 8g + 2t, 8g + 2t + 1: all 32 banks once.
  static constexpr bool kVByChannel = kTf32 && kCF;
  static constexpr int kVStride = kVByChannel ? kBlockN + 8 : kDv + kPad;
  static constexpr int kQFloats = kDk * kQStride;
  static constexpr int kKFloats = kDk * kKStride;
  static constexpr int kVFloats = kVByChannel ? kDv * kVStride : kBlockN * kVStride;
  static constexpr int kPFloats = kTf32 ? 0 : kBlockN * kPStride;  // per warp (FFMA path only)
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQFloats;
  static constexpr int kVOff = kKOff + 2 * kKFloats;
  static constexpr int kPOff = kVOff + 2 * kVFloats;
  static constexpr int kSmemBytes = (kPOff + kWarps * kPFloats) * 4;

  using QCopier = std::conditional_t<kCF, DirectCopier<kDk, kBlockM, kVecBytes, true, kQKPad>,
                                     TransposeCopier<kDk, kBlockM, true, kQKPad>>;
  using KCopier = std::conditional_t<kCF, DirectCopier<kDk, kBlockN, kVecBytes, true, kQKPad>,
                                     TransposeCopier<kDk, kBlockN, true, kQKPad>>;
  using VCopier = std::conditional_t<
      kVByChannel, DirectCopier<kDv, kBlockN, kVecBytes, true, 8>,
      std::conditional_t<kCF, TransposeCopier<kBlockN, kDv, false>,
                         DirectCopier<kBlockN, kDv, kVecBytes, false>>>;
  // Copier for each tile, built from the kernel parameters where it is used (they live in
  // constant memory) rather than kept live across the main loop: registers are the tight
  // resource. The copiers get the stride between tile rows; token n of a head sits at +n
  // channel-first and at +n * stride_n token-major (token_stride).
  __device__ __forceinline__ static QCopier q_copier(int tid, const FwdParams& p) {
    return QCopier(tid, kCF ? p.q.stride_d : p.q.stride_n);
  }
  __device__ __forceinline__ static KCopier k_copier(int tid, const FwdParams& p) {
    return KCopier(tid, kCF ? p.k.stride_d : p.k.stride_n);
  }
  __device__ __forceinline__ static VCopier v_copier(int tid, const FwdParams& p) {
    return VCopier(tid, kCF ? p.v.stride_d : p.v.stride_n);
  }
  __device__ __forceinline__ static int64_t token_stride(const Strided4& s) {
    return kCF ? 1 : s.stride_n;
  }
  // The (b, h) head of a [B, H, N, D] fp32 tensor.
  __device__ __forceinline__ static const float* head(const Strided4& s, int b, int h) {
    return static_cast<const float*>(s.ptr) + b * s.stride_b + h * s.stride_h;
  }
  // 2 CTAs x 256 threads per SM (<= 128 registers); smem is <= 110 KB per CTA for every
  // instantiated head-dim pair, so two fit in the 227 KB of sm_90 (one on sm_80's 164 KB).
  static constexpr int kMinBlocks = 2;
};

// One CTA's Q / K / V heads in global memory and the copies of its tiles into shared memory,
// shared by the exact kernel below and the TF32 one (fwd_f32_tf32.cuh). The copiers
// are built at each copy (F32Traits::q_copier).
template <class Tr>
struct F32TileSources {
  const float* q;
  const float* k;
  const float* v;
  int64_t q_ts, k_ts, v_ts;  // token strides

  __device__ __forceinline__ F32TileSources(const FwdParams& p, int b, int h)
      : q(Tr::head(p.q, b, h)),
        k(Tr::head(p.k, b, h)),
        v(Tr::head(p.v, b, h)),
        q_ts(Tr::token_stride(p.q)),
        k_ts(Tr::token_stride(p.k)),
        v_ts(Tr::token_stride(p.v)) {}

  // The Q tile of query rows m0 .. (tokens past N zero-filled).
  __device__ __forceinline__ void copy_q(float* sQ, int m0, int tid, const FwdParams& p) const {
    Tr::q_copier(tid, p).copy(sQ, q + m0 * q_ts, p.seqlen - m0);
  }
  // The K and V tiles of keys n0 ..
  __device__ __forceinline__ void copy_kv(float* sK, float* sV, int n0, int tid,
                                          const FwdParams& p) const {
    Tr::k_copier(tid, p).copy(sK, k + n0 * k_ts, p.seqlen - n0);
    Tr::v_copier(tid, p).copy(sV, v + n0 * v_ts, p.seqlen - n0);
  }
};

// ---------------------------------------------------------------------------------------------
// Key splits (FwdParams::kv_splits; the scratch's layout is kv_split_scratch.h)
// ---------------------------------------------------------------------------------------------
// Where a CTA's split leaves the rows of its (batch, head) bh: row n's log2 row sum at lse2[n],
// channel c of its normalized output at out[c * N + n].
struct SplitPart {
  float* lse2;
  float* out;
};
__device__ __forceinline__ SplitPart split_part(const FwdParams& p, const RowTileSplit& tile,
                                                int bh) {
  const KvSplitScratch layout(p, tile.splits);
  float* const scratch = static_cast<float*>(p.kv_split_scratch);
  return {scratch + layout.lse2_at(tile.split, bh, 0), scratch + layout.out_at(tile.split, bh, 0)};
}

// out and lse of row n of (batch, head) bh from the splits': each split's output weighted by
// its share of the row sum. A split whose scores are all -inf (row sum 0, output NaN) has no
// share; if every split's are, the row is NaN with lse -inf, as without splits.
// A thread takes kCombineChannels channels of one row, consecutive threads consecutive rows;
// blockIdx.x = channel group * row blocks + row block. Every split's value of a channel is
// loaded before any is used (a load under the share's branch left one in flight at a time).
constexpr int kCombineThreads = 128;
template <int kDv>
constexpr int kCombineChannels = kDv < 16 ? kDv : 16;
template <int kDv>
__global__ void __launch_bounds__(kCombineThreads) combine_kv_splits(const FwdParams p) {
  constexpr int kChannels = kCombineChannels<kDv>;
  const int N = p.seqlen;
  const int row_blocks = (N + kCombineThreads - 1) / kCombineThreads;
  const int group = blockIdx.x / row_blocks;
  const int n = (blockIdx.x % row_blocks) * kCombineThreads + threadIdx.x;
  const int bh = blockIdx.y;
  if (n >= N) return;
  const int splits = p.kv_splits;
  const KvSplitScratch layout(p, splits);
  const float* const scratch = static_cast<const float*>(p.kv_split_scratch);
  float w[kMaxKvSplits];
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < kMaxKvSplits; ++s) {
    w[s] = s < splits ? scratch[layout.lse2_at(s, bh, n)] : -INFINITY;
    m = fmaxf(m, w[s]);  // NaN shares are not the max; they make the row NaN below
  }
  float total = 0.f;
  unsigned has_share = 0;
#pragma unroll
  for (int s = 0; s < kMaxKvSplits; ++s) {
    if (w[s] != -INFINITY) has_share |= 1u << s;
    w[s] = w[s] == -INFINITY ? 0.f : exp2f(w[s] - m);
    total += w[s];
  }
  const float inv_total = 1.f / total;
  const int b = bh / p.heads, h = bh % p.heads;
  float* const out = static_cast<float*>(p.out.ptr) + b * p.out.stride_b + h * p.out.stride_h +
                     n * p.out.stride_n;
  // The splits' outputs of this row, channel 0 (channels N apart); splits past the last read
  // the last one's (in bounds, without a share).
  const float* part[kMaxKvSplits];
#pragma unroll
  for (int s = 0; s < kMaxKvSplits; ++s) {
    part[s] = scratch + layout.out_at(s < splits ? s : splits - 1, bh, n);
  }
#pragma unroll 4
  for (int c = group * kChannels; c < (group + 1) * kChannels; ++c) {
    float x[kMaxKvSplits];
#pragma unroll
    for (int s = 0; s < kMaxKvSplits; ++s) x[s] = part[s][int64_t(c) * N];
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxKvSplits; ++s) {
      acc = has_share >> s & 1u ? fmaf(w[s], x[s], acc) : acc;
    }
    out[c * p.out.stride_d] = acc * inv_total;
  }
  if (group == 0) {
    static_cast<float*>(p.lse)[static_cast<int64_t>(bh) * N + n] =
        (m + log2f(total)) * 0.6931471805599453f;
  }
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------
template <int kDk, int kDv, Layout kLayout, int kVecBytes, bool kTf32>
__global__ void __launch_bounds__(kThreads, (F32Traits<kDk, kDv, kLayout, kVecBytes, kTf32>::kMinBlocks))
    flash_fwd_f32_kernel(const __grid_constant__ FwdParams params, const float scale_log2) {
  using Tr = F32Traits<kDk, kDv, kLayout, kVecBytes, kTf32>;
  static_assert(!kTf32, "the TF32 path is flash_fwd_tf32_kernel");
  constexpr bool kCF = Tr::kCF;
  constexpr int kBlockN = Tr::kBlockN;
  constexpr int kTN = Tr::kTN;
  constexpr int kTV = Tr::kTV;

  extern __shared__ __align__(16) float smem[];
  float* const sQ = smem + Tr::kQOff;
  float* const sK = smem + Tr::kKOff;
  float* const sV = smem + Tr::kVOff;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int N = params.seqlen;
  const int bh = block_bh<false>();
  const int b = bh / params.heads;
  const int h = bh % params.heads;
  // With key splits, the CTAs of a row tile each take a run of its key tiles.
  const RowTileSplit tile = row_tile_split<false>(N);
  const int m0 = tile.m0;
  const auto [j_begin, j_end] = tile.key_tiles((N + kBlockN - 1) / kBlockN);

  const F32TileSources<Tr> src(params, b, h);

  // Prologue: Q and the first K/V tile, one cp.async group.
  src.copy_q(sQ, m0, tid, params);
  src.copy_kv(sK + (j_begin & 1) * Tr::kKFloats, sV + (j_begin & 1) * Tr::kVFloats,
              j_begin * kBlockN, tid, params);
  cp_async_commit();

  // FFMA path state (the TF32 path is below).
  const int tx = lane / 4;
  const int ty = lane % 4;
  float o[4][kTV];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < kTV; ++c) o[i][c] = 0.f;
  // Running max (log2 units, scale folded in) and this thread's partial row sums (reduced over
  // the 8 tx lanes of a row once, at the end: all of them see the same max and rescale factors).
  float row_max[4], row_sum[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
  }
  const float* const sQw = sQ + warp * kRowsPerWarp + ty * 4;
  float* const sPw = smem + Tr::kPOff + warp * Tr::kPFloats;

  for (int j = j_begin; j < j_end; ++j) {
    const int stage = j & 1;
    const int n0 = j * kBlockN;
    // Tile j landed (the only group in flight); the barrier publishes it and tells that every
    // warp is done with tile j - 1, whose stage is refilled next.
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < j_end) {
      src.copy_kv(sK + (stage ^ 1) * Tr::kKFloats, sV + (stage ^ 1) * Tr::kVFloats,
                  n0 + kBlockN, tid, params);
    }
    cp_async_commit();

    // ---- S = Q K^T: 4 rows x kTN keys per thread ----
    const float* sKs = sK + stage * Tr::kKFloats;
    float s[4][kTN];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < kTN; ++c) s[i][c] = 0.f;
#pragma unroll kUnroll<kDv>
    for (int k = 0; k < kDk; ++k) {
      const float4 a = lds128(sQw + k * Tr::kQStride);
      float kb[kTN];
      load_cols<kTN>(kb, sKs + k * Tr::kKStride, tx);
#pragma unroll
      for (int c = 0; c < kTN; ++c) {
        s[0][c] = fmaf(a.x, kb[c], s[0][c]);
        s[1][c] = fmaf(a.y, kb[c], s[1][c]);
        s[2][c] = fmaf(a.z, kb[c], s[2][c]);
        s[3][c] = fmaf(a.w, kb[c], s[3][c]);
      }
    }

    // ---- Keys past N (last tile only): -inf, weight 0 ----
    if (n0 + kBlockN > N) {
#pragma unroll
      for (int c = 0; c < kTN; ++c) {
        if (n0 + mcol<kTN>(tx, c) >= N) {
#pragma unroll
          for (int i = 0; i < 4; ++i) s[i][c] = -INFINITY;
        }
      }
    }

    // ---- Online softmax, base 2 ----
    // Max on raw scores, scaled once (the plan requires scale >= 0); p = 2^(s * c - m).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = s[i][0];
#pragma unroll
      for (int c = 1; c < kTN; ++c) mx = fmaxf(mx, s[i][c]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(row_max[i], mx * scale_log2);
      // All scores so far -inf: 0 as the reference (weights 0, not NaN); NaN scores still
      // poison the row as in eager (fmaxf skips them, exp2f(NaN) = NaN).
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = ex2(row_max[i] - m_ref);  // 0 on the first tile
      row_max[i] = m_new;
      const float neg_m = -m_ref;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kTN; ++c) {
        s[i][c] = ex2(fmaf(s[i][c], scale_log2, neg_m));
        sum += s[i][c];
      }
      row_sum[i] = fmaf(row_sum[i], alpha, sum);
#pragma unroll
      for (int c = 0; c < kTV; ++c) o[i][c] *= alpha;
    }

    // ---- P -> the warp's buffer, [key][row]: one float4 (4 rows) per key ----
    // Lanes 8q..8q+7 (tx = 2q, 2q+1; ty = 0..3) write 2 keys 4 apart = 4 * kPStride = 80 floats
    // = 16 banks apart: conflict free per quarter warp.
#pragma unroll
    for (int c = 0; c < kTN; ++c) {
      sts128(sPw + mcol<kTN>(tx, c) * kPStride + ty * 4,
             make_float4(s[0][c], s[1][c], s[2][c], s[3][c]));
    }
    __syncwarp();

    // ---- O += P V: 4 rows x kTV channels per thread ----
    // One fp32 chain per output over all of a row's keys. Summing each tile's products apart
    // and adding them to O is several times more accurate at long rows, but keeps more
    // registers live through the loop and measured slower at every shape, so not.
    const float* sVs = sV + stage * Tr::kVFloats;
    const float* sPr = sPw + ty * 4;
#pragma unroll kUnroll<kDv>
    for (int kk = 0; kk < kBlockN; ++kk) {
      const float4 p = lds128(sPr + kk * kPStride);
      float vb[kTV];
      load_cols<kTV>(vb, sVs + kk * Tr::kVStride, tx);
#pragma unroll
      for (int c = 0; c < kTV; ++c) {
        o[0][c] = fmaf(p.x, vb[c], o[0][c]);
        o[1][c] = fmaf(p.y, vb[c], o[1][c]);
        o[2][c] = fmaf(p.z, vb[c], o[2][c]);
        o[3][c] = fmaf(p.w, vb[c], o[3][c]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups are left

  // ---- Epilogue ----
  const int bh_e = block_bh<true>();
  const int b_e = bh_e / params.heads;
  const int h_e = bh_e % params.heads;
  float inv_l[4];
  const RowTileSplit tile_e = row_tile_split<true>(N);
  const int splits_e = tile_e.splits;
  const int n_base = tile_e.m0 + warp * kRowsPerWarp + ty * 4;  // rows n_base + i
  const SplitPart part =
      splits_e > 1 ? split_part(params, tile_e, bh_e) : SplitPart{nullptr, nullptr};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float l = row_sum[i];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    // l == 0 only for rows whose scores are all -inf: 0 * inf = NaN, as eager softmax gives.
    inv_l[i] = 1.f / l;
    const int n = n_base + i;
    if (tx == 0 && n < N) {
      // lse = ln(sum_j exp(scale * s_j)) = ln2 * (m + log2(l)), m in scaled log2 units; a
      // split leaves it in log2 units for combine_kv_splits.
      const float lse2 = row_max[i] + log2f(l);
      if (splits_e > 1) {
        part.lse2[n] = lse2;
      } else {
        static_cast<float*>(params.lse)[static_cast<int64_t>(bh_e) * N + n] =
            lse2 * 0.6931471805599453f;
      }
    }
  }
  if (splits_e > 1) {
    // This split's normalized output, [c][n] per (batch, head): combine_kv_splits reads a
    // channel of consecutive rows per warp.
#pragma unroll
    for (int c = 0; c < kTV; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (n_base + i < N) {
          part.out[static_cast<int64_t>(mcol<kTV>(tx, c)) * N + n_base + i] = o[i][c] * inv_l[i];
        }
      }
    }
    return;
  }

  float* const out_head =
      static_cast<float*>(params.out.ptr) + b_e * params.out.stride_b + h_e * params.out.stride_h;
  if constexpr (kCF) {
    // out[c][n]: 4 consecutive tokens per channel; lanes of one channel cover 64 contiguous bytes.
#pragma unroll
    for (int c = 0; c < kTV; ++c) {
      float* dst = out_head + mcol<kTV>(tx, c) * params.out.stride_d + n_base;
      const float x0 = o[0][c] * inv_l[0], x1 = o[1][c] * inv_l[1];
      const float x2 = o[2][c] * inv_l[2], x3 = o[3][c] * inv_l[3];
      if (kVecBytes == 16 && n_base + 3 < N) {
        *reinterpret_cast<float4*>(dst) = make_float4(x0, x1, x2, x3);
      } else {
        if (n_base < N) dst[0] = x0;
        if (n_base + 1 < N) dst[1] = x1;
        if (n_base + 2 < N) dst[2] = x2;
        if (n_base + 3 < N) dst[3] = x3;
      }
    }
  } else {
    // out[n][c]: float4 of 4 consecutive channels; the 8 tx lanes cover 128 contiguous bytes.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n_base + i;
      if (n >= N) continue;
      float* dst = out_head + n * params.out.stride_n;
      if constexpr (kTV >= 4) {
#pragma unroll
        for (int q = 0; q < kTV / 4; ++q) {
          float* d = dst + mcol<kTV>(tx, 4 * q);
          const float4 x = make_float4(o[i][4 * q] * inv_l[i], o[i][4 * q + 1] * inv_l[i],
                                       o[i][4 * q + 2] * inv_l[i], o[i][4 * q + 3] * inv_l[i]);
          if constexpr (kVecBytes == 16) {
            *reinterpret_cast<float4*>(d) = x;
          } else {
            d[0] = x.x;
            d[1] = x.y;
            d[2] = x.z;
            d[3] = x.w;
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kTV; ++c) dst[mcol<kTV>(tx, c)] = o[i][c] * inv_l[i];
      }
    }
  }
}

// Defined in fwd_f32_tf32.cuh, which only the _tf32 instantiation files include.
template <int kDk, int kDv, Layout kLayout, int kVecBytes>
__global__ void __launch_bounds__(kThreads, (F32Traits<kDk, kDv, kLayout, kVecBytes, true>::kMinBlocks))
    flash_fwd_tf32_kernel(const __grid_constant__ FwdParams params, const float scale_log2);

// ---------------------------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------------------------
template <int kDk, int kDv, Layout kLayout, int kVecBytes, bool kTf32>
void launch(const FwdParams& params, cudaStream_t stream) {
  using Tr = F32Traits<kDk, kDv, kLayout, kVecBytes, kTf32>;
  const int bh = params.batch * params.heads;
  if (params.seqlen <= 0 || bh <= 0) return;
  constexpr auto kernel = [] {
    if constexpr (kTf32) {
      return flash_fwd_tf32_kernel<kDk, kDv, kLayout, kVecBytes>;
    } else {
      return flash_fwd_f32_kernel<kDk, kDv, kLayout, kVecBytes, false>;
    }
  }();
  constexpr int smem = Tr::kSmemBytes;
  if constexpr (smem > 48 * 1024) allow_dynamic_smem_once<kernel>(smem);
  const int splits = params.kv_splits > 1 ? params.kv_splits : 1;
  dim3 grid = row_tile_grid(params.seqlen, kBlockM, bh);
  grid.x *= splits;
  kernel<<<grid, kThreads, smem, stream>>>(params, softmax_scale_log2(params.scale));
  if (splits > 1) {
    const int row_blocks = (params.seqlen + kCombineThreads - 1) / kCombineThreads;
    combine_kv_splits<kDv><<<dim3(row_blocks * (kDv / kCombineChannels<kDv>), bh),
                             kCombineThreads, 0, stream>>>(params);
  }
}

}  // namespace flash_fwd_f32_detail

// Instantiated in instances/sm80_fwd_fp32_*.cu. The caller checks for launch errors.
template <int kDk, int kDv, Layout kLayout, int kVecBytes, bool kTf32>
void launch_fwd_f32(const FwdParams& params, cudaStream_t stream) {
  flash_fwd_f32_detail::launch<kDk, kDv, kLayout, kVecBytes, kTf32>(params, stream);
}

}  // namespace psa_fa2
