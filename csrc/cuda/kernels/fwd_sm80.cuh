// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, bf16/fp16 in, fp32 accumulate).
//
// One CTA computes kBlockM query rows of one (batch, head): it keeps its Q tile in registers,
// streams K/V in kBlockN-token tiles through double-buffered shared memory (cp.async), and keeps
// the output accumulator and the online-softmax state (row max m, row sum l) in registers.
//
// Both layouts of attention_params.h are handled by the same code; only the shared-memory tile
// orientation and the ldmatrix flavour change:
//   token-major  (stride_d == 1): tiles are stored [token][d]; Q and K give their fragments
//                with plain ldmatrix, V (the B operand of P V, needed k-major) with ldmatrix.trans.
//   channel-first (stride_n == 1): tiles are stored [d][token]; Q and K need ldmatrix.trans,
//                V is already "col" for P V and uses plain ldmatrix.
// Tiles are copied with cp.async of kVecBytes = 16, 8 or 4 bytes, the widest size that every
// tile row start allows (the plan, plan.cpp, picks it from the real pointers and strides):
// 16 whenever rows are 16-byte aligned; channel-first views with stride_d = N take 8 when
// N % 4 == 0, 4 when N is even. Odd N (kVecBytes = 2) has no cp.async form and uses synchronous
// 2-byte loads (TileScalarCopier). Token-major is always 16.
//
// Only CUDA headers and attention_params.h are included: each instantiation .cu stays fast to build.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../attention_params.h"
#include "launch_util.h"
#include "launchers.h"
#include "mma_softmax.cuh"
#include "mma_sync_ptx.cuh"

namespace psa_fa2 {
namespace flash_fwd_detail {

// Tile choice. 64 query rows = 4 warps x 16 rows (one m16 MMA row block per warp, so the softmax
// row statistics never leave a warp). 64 keys per K/V tile: S (16x64 fp32) is 32 registers per
// thread, which leaves room for the O accumulator up to dv = 128 without spilling, and keeps two
// 64-key stages of K and V at (32, 64) within 24 KB so several CTAs share an SM. At N = 400 and
// BH = 64 a 64-row tile gives 448 CTAs for 132 SMs (3.4 per SM) where 128 rows would give 256
// (1.9 per SM, and a worse balance between SMs with 2 and with 1).
constexpr int kBlockM = 64;
constexpr int kWarps = kBlockM / 16;
constexpr int kThreads = kWarps * 32;

// ---------------------------------------------------------------------------------------------
// Element conversions (the kernel moves bf16 / fp16 data as raw 16-bit words)
// ---------------------------------------------------------------------------------------------
template <DType kDtype>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<DType::kBFloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<DType::kFloat16>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <DType kDtype>
__device__ __forceinline__ uint16_t to_bits(float x);
template <>
__device__ __forceinline__ uint16_t to_bits<DType::kBFloat16>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ uint16_t to_bits<DType::kFloat16>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

// The A fragment (16 x 16, rounded to kDtype) of k16 step kk from the fp32 C fragments 2kk and
// 2kk+1 of the same 16 rows: C tile j holds columns 8j + 2t, +1 of rows g and g + 8, which is
// A's (row, k) order, so a product's result feeds the next product from registers (P into
// P V in the forward; P^T and dS^T into dV and dK in the Hopper backward).
template <DType kDtype, int kCTiles>
__device__ __forceinline__ void pack_a_fragment(uint32_t (&a)[4], const float (&c)[kCTiles][4],
                                                int kk) {
  a[0] = pack2<kDtype>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<kDtype>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<kDtype>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<kDtype>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// The PTX wrappers (mma_sync_ptx.cuh), by their short names here and in the Hopper kernels.
using ptx::cp_async;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldsm_x4;
using ptx::ldsm_x4_trans;
using ptx::mma_16816;
using ptx::smem_u32;

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles
// ---------------------------------------------------------------------------------------------
// A kRows x kCols tile of 16-bit elements, addressed in 16-byte chunks (8 elements). Every
// ldmatrix phase reads one chunk from each of 8 consecutive rows (aligned to 8), and every
// cp.async / staging access touches consecutive chunks of a row, so the XOR swizzle below makes
// the 8 chunks of a phase fall into 8 distinct 16-byte bank groups:
//   rows >= 128 B (>= 8 chunks): chunk ^= row % 8;
//   64 B rows (4 chunks, two rows per 128-byte bank line): chunk ^= (row / 2) % 4;
//   32 B rows (2 chunks, four rows per line): chunk ^= (row / 4) % 2.
// No padding, so tiles stay dense and cp.async writes stay 16-byte aligned.
template <int kRows, int kCols>
struct SmemTile {
  static_assert(kCols % 16 == 0, "tile rows must hold whole 16x16 MMA blocks");
  static constexpr int kNumRows = kRows;
  static constexpr int kNumCols = kCols;
  static constexpr int kChunks = kCols / 8;
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  static constexpr int kKeyMask = (kChunks >= 8 ? 8 : kChunks) - 1;
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;

  // Element offset of the first element of logical chunk `chunk` of row `row`.
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return row * kCols + ((chunk ^ ((row / kRowsPerLine) & kKeyMask)) << 3);
  }
};

// Copies tiles from global memory with cp.async of kVecBytes (16, 8 or 4) = kVecElems elements.
// Global element (row, col) of a tile lives at gtile + row * row_stride + col (unit stride along
// a tile row; the plan (plan.cpp) checked that the pointers and row_stride keep every vector
// kVecBytes-aligned). Thread tid copies vector tid % kVecsPerRow of rows tid / kVecsPerRow +
// i * kRowStep. Everything per thread is computed once, so a K/V tile costs one 64-bit add and
// one shared address per vector: keeping this state small is what keeps the kernel under the
// register budget.
//
// Vectors narrower than 16 bytes are the aligned pieces of one swizzled 16-byte chunk (the
// swizzle permutes whole chunks), so the shared tile is the same for every kVecBytes.
//
// `valid` counts the tokens left from the tile start. Token-major tiles hold tokens along rows
// (a row is all in or all out); channel-first tiles hold them along columns, where the last vector
// may be partial and cp.async zero-fills its tail. Out-of-range vectors read nothing (src-size 0)
// and are pointed at gtile, which is always a valid (and kVecBytes-aligned) address.
template <class Tile, bool kTokensAlongCols, int kVecBytes = 16>
struct TileCopier {
  static_assert(kVecBytes == 16 || kVecBytes == 8 || kVecBytes == 4, "cp.async sizes");
  static constexpr int kVecElems = kVecBytes / 2;
  static constexpr int kVecsPerChunk = 16 / kVecBytes;
  static constexpr int kVecsPerRow = Tile::kNumCols / kVecElems;
  static constexpr int kPerThread = Tile::kNumRows * kVecsPerRow / kThreads;
  static constexpr int kRowStep = kThreads / kVecsPerRow;
  static_assert(Tile::kNumRows * kVecsPerRow % kThreads == 0 && kThreads % kVecsPerRow == 0,
                "every thread copies the same number of vectors");
  // The swizzle key repeats every kPeriod rows. When kRowStep is a multiple of it (always at
  // 16 bytes), the shared address of a thread's i-th vector is its first one plus a compile-time
  // constant; otherwise the thread keeps the kDistinct = kPeriod / kRowStep addresses of its
  // first kDistinct vectors, and vector i is vector i % kDistinct plus a constant.
  static constexpr int kPeriod = Tile::kRowsPerLine * (Tile::kKeyMask + 1);
  static_assert(kRowStep % kPeriod == 0 || kPeriod % kRowStep == 0, "swizzle period");
  static constexpr int kDistinct = kRowStep % kPeriod == 0 ? 1 : kPeriod / kRowStep;
  static_assert(kPerThread % kDistinct == 0, "whole swizzle periods per thread");
  static constexpr uint32_t kSmemStep = kDistinct * kRowStep * Tile::kNumCols * 2;  // bytes

  int64_t goff;   // thread's first vector, elements from the tile start
  int64_t gstep;  // kRowStep rows, elements
  uint32_t soff[kDistinct];  // thread's first kDistinct vectors, bytes from the shared tile start
  int row0;
  int col0;

  __device__ __forceinline__ TileCopier(int tid, int64_t row_stride) {
    row0 = tid / kVecsPerRow;
    const int vec = tid % kVecsPerRow;
    const int chunk = vec / kVecsPerChunk;
    col0 = vec * kVecElems;
    goff = row0 * row_stride + col0;
    gstep = kRowStep * row_stride;
#pragma unroll
    for (int d = 0; d < kDistinct; ++d) {
      soff[d] = 2u * static_cast<uint32_t>(Tile::offset(row0 + d * kRowStep, chunk) +
                                            (vec % kVecsPerChunk) * kVecElems);
    }
  }

  __device__ __forceinline__ void copy(uint32_t stile, const uint16_t* gtile, int valid) const {
    int cols_bytes = kVecBytes;
    if constexpr (kTokensAlongCols) {
      const int left = valid - col0;
      cols_bytes = left >= kVecElems ? kVecBytes : (left > 0 ? left * 2 : 0);
    }
    const uint16_t* src = gtile + goff;  // stepped: see TileScalarCopier::copy
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int bytes =
          kTokensAlongCols ? cols_bytes : (row0 + i * kRowStep < valid ? kVecBytes : 0);
      cp_async<kVecBytes>(stile + soff[i % kDistinct] + (i / kDistinct) * kSmemStep,
                          bytes > 0 ? src : gtile, bytes);
      src += gstep;
    }
  }

  // A tile whose tokens are all below N: the same copies without the range checks.
  __device__ __forceinline__ void copy_full(uint32_t stile, const uint16_t* gtile) const {
    const uint16_t* src = gtile + goff;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      cp_async<kVecBytes>(stile + soff[i % kDistinct] + (i / kDistinct) * kSmemStep, src,
                          kVecBytes);
      src += gstep;
    }
  }
};

// Channel-first tiles whose rows are only 2-byte aligned (the PSA views at odd N, where
// stride_d = N): cp.async needs 4-, 8- or 16-byte aligned sources, so the tile is loaded with
// 2-byte loads and written to shared memory by the threads themselves. Consecutive threads take
// consecutive tokens of a row, so each warp load is 64 contiguous bytes. The loads complete
// before the stores, so the data is in shared memory when copy() returns; the barriers of the
// pipeline publish it exactly as they publish cp.async data (whose waits become no-ops).
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

template <class Tile>
struct TileScalarCopier {
  static constexpr int kPerThread = Tile::kElems / kThreads;
  static constexpr int kRowStep = kThreads / Tile::kNumCols;
  static_assert(Tile::kElems % kThreads == 0 && kThreads % Tile::kNumCols == 0,
                "every thread copies the same number of elements");

  int64_t goff;   // thread's first element, from the tile start
  int64_t gstep;  // kRowStep rows
  int row0;
  int col;

  __device__ __forceinline__ TileScalarCopier(int tid, int64_t row_stride) {
    row0 = tid / Tile::kNumCols;
    col = tid % Tile::kNumCols;
    goff = row0 * row_stride + col;
    gstep = kRowStep * row_stride;
  }

  // Loads in flight per batch: all of them at dv <= 64 (one load latency per tile); two batches
  // at dv = 128, whose 64 values per thread would not fit beside the accumulators.
  static constexpr int kBatch = kPerThread < 32 ? kPerThread : 32;
  static_assert(kPerThread % kBatch == 0, "whole batches");

  __device__ __forceinline__ void copy(uint32_t stile, const uint16_t* gtile, int valid) const {
    const bool in = col < valid;
    // Stepped pointer rather than goff + i * gstep: the offsets are loop-invariant, and ptxas
    // would otherwise keep all of them in registers across the main loop.
    const uint16_t* src = gtile + goff;
#pragma unroll
    for (int i0 = 0; i0 < kPerThread; i0 += kBatch) {
      uint16_t v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        v[i] = in ? __ldg(src) : uint16_t(0);
        src += gstep;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int row = row0 + (i0 + i) * kRowStep;
        st_shared_u16(stile + 2u * (Tile::offset(row, col / 8) + col % 8), v[i]);
      }
    }
  }

  __device__ __forceinline__ void copy_full(uint32_t stile, const uint16_t* gtile) const {
    copy(stile, gtile, Tile::kNumCols);
  }
};

// ---------------------------------------------------------------------------------------------
// Shared by the kernels of this file and the Hopper kernels (fwd_sm90.cuh, bwd_sm90.cuh)
// ---------------------------------------------------------------------------------------------
// The copier of a tile with kVecBytes-wide global vectors. kVecBytes = 2 (odd N, channel-first)
// has no cp.async form: synchronous 2-byte loads. std::conditional_t instantiates both
// declarations, so the cp.async copier of the 2-byte variant is named with a placeholder width
// it never uses.
template <class Tile, bool kCF, int kVecBytes>
using CopierFor = std::conditional_t<(kVecBytes >= 4),
                                     TileCopier<Tile, kCF, (kVecBytes >= 4 ? kVecBytes : 16)>,
                                     TileScalarCopier<Tile>>;

// The global side of one CTA's Q / K / V tiles: the (batch, head)'s base pointers, the stride
// between tile rows (d channel-first, tokens token-major) and the copiers of Tr's tiles, Q's of
// kVecBytes-wide vectors and K's and V's of kKVVecBytes.
template <class Tr, int kVecBytes, int kKVVecBytes = kVecBytes>
struct TileSources {
  static constexpr bool kCF = Tr::kCF;
  template <class Tile, int kBytes>
  using Copier = CopierFor<Tile, kCF, kBytes>;

  const uint16_t* q;  // token 0 of the head
  const uint16_t* k;
  const uint16_t* v;
  int64_t q_rs, k_rs, v_rs;  // between tile rows, elements
  Copier<typename Tr::QTile, kVecBytes> q_copier;
  Copier<typename Tr::KTile, kKVVecBytes> k_copier;
  Copier<typename Tr::VTile, kKVVecBytes> v_copier;

  __device__ __forceinline__ TileSources(const FwdParams& p, int b, int h, int tid)
      : q(head(p.q, b, h)),
        k(head(p.k, b, h)),
        v(head(p.v, b, h)),
        q_rs(row_stride(p.q)),
        k_rs(row_stride(p.k)),
        v_rs(row_stride(p.v)),
        q_copier(tid, q_rs),
        k_copier(tid, k_rs),
        v_copier(tid, v_rs) {}

  __device__ __forceinline__ static const uint16_t* head(const Strided4& s, int b, int h) {
    return static_cast<const uint16_t*>(s.ptr) + b * s.stride_b + h * s.stride_h;
  }
  __device__ __forceinline__ static int64_t row_stride(const Strided4& s) {
    return kCF ? s.stride_d : s.stride_n;
  }
  // Token n of a head: n elements along the rows channel-first, n rows down token-major.
  __device__ __forceinline__ static const uint16_t* at(const uint16_t* head, int64_t rs, int n) {
    return kCF ? head + n : head + n * rs;
  }
  __device__ __forceinline__ const uint16_t* q_at(int n) const { return at(q, q_rs, n); }
  __device__ __forceinline__ const uint16_t* k_at(int n) const { return at(k, k_rs, n); }
  __device__ __forceinline__ const uint16_t* v_at(int n) const { return at(v, v_rs, n); }
};

// This warp's A fragments (its 16 tokens x kKSteps k16 steps over d) from a shared tile of
// 4 x 16 tokens: Q in the forward kernels, K and V in the Hopper backward. r[i] of a step must
// be the 8x8 block (rows (i%2)*8.., k (i/2)*8..) of the warp's 16 x 16 slice: channel-first
// tiles are stored [d][m], so the block is the transpose of 8 d-rows x 8 m-columns
// (ldmatrix.trans); token-major ones [m][d] (plain ldmatrix).
template <class QTile, bool kCF, int kKSteps>
__device__ __forceinline__ void load_a_fragments(uint32_t (&qf)[kKSteps][4], uint32_t sQ,
                                                 int warp, int lane) {
  const int li = lane / 8;  // which 8x8 matrix this lane addresses in an ldmatrix.x4
  const int lr = lane % 8;  // which row of it
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    if constexpr (kCF) {
      const int row = kk * 16 + (li / 2) * 8 + lr;
      const int chunk = warp * 2 + (li % 2);
      ldsm_x4_trans(qf[kk], sQ + 2u * QTile::offset(row, chunk));
    } else {
      const int row = warp * 16 + (li % 2) * 8 + lr;
      const int chunk = kk * 2 + (li / 2);
      ldsm_x4(qf[kk], sQ + 2u * QTile::offset(row, chunk));
    }
  }
}

// S = Q K^T of this warp's 16 query rows (qf: their A fragments) and the 8 * kSTiles keys of a
// shared K tile, on mma.sync: C fragments, previous contents of s dropped.
template <class KTile, bool kCF, DType kDtype, int kSTiles, int kKSteps>
__device__ __forceinline__ void warp_scores(float (&s)[kSTiles][4],
                                            const uint32_t (&qf)[kKSteps][4], uint32_t sKs,
                                            int lane) {
  const int li = lane / 8;  // which 8x8 matrix this lane addresses in an ldmatrix.x4
  const int lr = lane % 8;  // which row of it
#pragma unroll
  for (int i = 0; i < kSTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int p = 0; p < kSTiles / 2; ++p) {
      // b[0], b[1]: (k lo, k hi) of key tile 2p; b[2], b[3]: the same for key tile 2p+1.
      uint32_t bf[4];
      if constexpr (kCF) {
        // Stored [d][n] = B itself (k rows): transpose 8 d-rows x 8 keys per block.
        const int row = kk * 16 + (li % 2) * 8 + lr;
        const int chunk = p * 2 + (li / 2);
        ldsm_x4_trans(bf, sKs + 2u * KTile::offset(row, chunk));
      } else {
        // Stored [n][d] = B^T: each 8 keys x 8 d block is already the "col" fragment.
        const int row = p * 16 + (li / 2) * 8 + lr;
        const int chunk = kk * 2 + (li % 2);
        ldsm_x4(bf, sKs + 2u * KTile::offset(row, chunk));
      }
      mma_16816<kDtype>(s[2 * p], qf[kk], bf[0], bf[1]);
      mma_16816<kDtype>(s[2 * p + 1], qf[kk], bf[2], bf[3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The epilogue
// ---------------------------------------------------------------------------------------------
// Writes lse and the normalised output of kBlockM query rows from m0 on, held by kThreads
// threads (tid: this thread's index among them; their warps' O accumulators, C fragments of 16
// rows per warp, and softmax state), staged in the OTile at `staging`, which the caller has
// made free (every warp past its last read). Every thread of the CTA must call it (it holds CTA
// barriers). row_sum: this lane's partial sums of rows g and g + 8.
template <class Tr, DType kDtype, int kVecBytes, int kOTiles>
__device__ __forceinline__ void store_out_lse(const FwdParams& params, const float (&o)[kOTiles][4],
                                              const float (&row_max)[2], const float (&row_sum)[2],
                                              unsigned char* staging, int bh, int m0, int tid) {
  using OTile = typename Tr::OTile;
  constexpr bool kCF = Tr::kCF;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int N = params.seqlen;
  const int b = bh / params.heads;
  const int h = bh % params.heads;

  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // l == 0 only for rows whose scores are all -inf: 0 * inf = NaN, as eager softmax gives.
    inv_l[r] = 1.f / l;
    if (t == 0) {
      const int n = m0 + warp * 16 + g + 8 * r;
      if (n < N) {
        // lse = ln(sum_j exp(scale * s_j)) = ln2 * (m + log2(l)), m in scaled log2 units.
        static_cast<float*>(params.lse)[static_cast<int64_t>(bh) * N + n] =
            (row_max[r] + log2f(l)) * 0.6931471805599453f;
      }
    }
  }

  // Stage O (normalised, converted) in shared memory so the global stores are full 16-byte
  // chunks along the unit-stride dimension: along d token-major, along tokens channel-first.
  uint16_t* sO = reinterpret_cast<uint16_t*>(staging);
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int m = warp * 16 + g + 8 * r;  // row within the CTA tile
      const float x0 = o[i][2 * r] * inv_l[r];
      const float x1 = o[i][2 * r + 1] * inv_l[r];
      if constexpr (kCF) {
        // Stored [dv][m]: the two values sit in consecutive dv rows.
        sO[OTile::offset(i * 8 + 2 * t, m / 8) + m % 8] = to_bits<kDtype>(x0);
        sO[OTile::offset(i * 8 + 2 * t + 1, m / 8) + m % 8] = to_bits<kDtype>(x1);
      } else {
        *reinterpret_cast<uint32_t*>(sO + OTile::offset(m, i) + 2 * t) = pack2<kDtype>(x0, x1);
      }
    }
  }
  __syncthreads();

  uint16_t* out_head = static_cast<uint16_t*>(params.out.ptr) + b * params.out.stride_b +
                       h * params.out.stride_h;
  if constexpr (kVecBytes == 2) {
    // Channel-first at odd N: 2-byte stores, consecutive threads on consecutive tokens.
    constexpr int kPerThread = OTile::kElems / kThreads;
    constexpr int kRowStep = kThreads / kBlockM;
    const int col = tid % kBlockM;
    const int n = m0 + col;
    if (n < N) {
#pragma unroll
      for (int it = 0; it < kPerThread; ++it) {
        const int row = tid / kBlockM + it * kRowStep;  // d
        out_head[row * params.out.stride_d + n] = sO[OTile::offset(row, col / 8) + col % 8];
      }
    }
  } else if constexpr (kVecBytes < 16) {
    // Channel-first with rows aligned to kVecBytes (8 or 4) only: stores of that width, pieces
    // of the swizzled 16-byte chunks of sO; a partial last piece is written element by element.
    constexpr int kVecElems = kVecBytes / 2;
    constexpr int kVecsPerChunk = 16 / kVecBytes;
    constexpr int kVecsPerRow = OTile::kNumCols / kVecElems;
    constexpr int kOutVecs = OTile::kNumRows * kVecsPerRow;
    static_assert(kOutVecs % kThreads == 0, "every thread stores the same number of vectors");
#pragma unroll
    for (int it = 0; it < kOutVecs / kThreads; ++it) {
      const int idx = tid + it * kThreads;
      const int row = idx / kVecsPerRow;  // d
      const int vec = idx % kVecsPerRow;  // kVecElems tokens
      const uint16_t* sp =
          sO + OTile::offset(row, vec / kVecsPerChunk) + (vec % kVecsPerChunk) * kVecElems;
      const int n = m0 + vec * kVecElems;
      const int left = N - n;
      uint16_t* dst = out_head + row * params.out.stride_d + n;
      if constexpr (kVecBytes == 8) {
        const uint2 val = *reinterpret_cast<const uint2*>(sp);
        if (left >= kVecElems) {
          *reinterpret_cast<uint2*>(dst) = val;
        } else if (left > 0) {
          const uint32_t w[2] = {val.x, val.y};
#pragma unroll
          for (int x = 0; x < kVecElems; ++x) {
            if (x < left) dst[x] = static_cast<uint16_t>(w[x / 2] >> (16 * (x % 2)));
          }
        }
      } else {
        const uint32_t val = *reinterpret_cast<const uint32_t*>(sp);
        if (left >= kVecElems) {
          *reinterpret_cast<uint32_t*>(dst) = val;
        } else if (left > 0) {
          dst[0] = static_cast<uint16_t>(val);
        }
      }
    }
  } else {
    constexpr int kOutChunks = OTile::kNumRows * OTile::kChunks;
    static_assert(kOutChunks % kThreads == 0, "every thread stores the same number of chunks");
#pragma unroll
    for (int it = 0; it < kOutChunks / kThreads; ++it) {
      const int idx = tid + it * kThreads;
      const int row = idx / OTile::kChunks;
      const int chunk = idx % OTile::kChunks;
      const uint4 val = *reinterpret_cast<const uint4*>(sO + OTile::offset(row, chunk));
      if constexpr (kCF) {
        // row = d, chunk = 8 tokens; a partial last chunk is written element by element.
        const int n = m0 + chunk * 8;
        const int left = N - n;
        uint16_t* dst = out_head + row * params.out.stride_d + n;
        if (left >= 8) {
          *reinterpret_cast<uint4*>(dst) = val;
        } else if (left > 0) {
          // Constant indices keep val in registers (a variable index would put it on the stack).
          const uint32_t w[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
          for (int x = 0; x < 8; ++x) {
            if (x < left) dst[x] = static_cast<uint16_t>(w[x / 2] >> (16 * (x % 2)));
          }
        }
      } else {
        // row = token, chunk = 8 dv values.
        const int n = m0 + row;
        if (n < N) {
          *reinterpret_cast<uint4*>(out_head + n * params.out.stride_n + chunk * 8) = val;
        }
      }
    }
  }
}

// The same for a CTA of kThreads threads and kBlockM rows, staged at Tr::kOOffset.
template <class Tr, DType kDtype, int kVecBytes, int kOTiles>
__device__ __forceinline__ void store_out_lse(const FwdParams& params, const float (&o)[kOTiles][4],
                                              const float (&row_max)[2], const float (&row_sum)[2],
                                              unsigned char* smem, int bh, int m0) {
  store_out_lse<Tr, kDtype, kVecBytes>(params, o, row_max, row_sum, smem + Tr::kOOffset, bh, m0,
                                       static_cast<int>(threadIdx.x));
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------
// kVecBytes: the global-memory access width (16, 8, 4 or 2 bytes) that every tile row start
// allows (the plan, plan.cpp, picks it). Only the channel-first layout has the narrower variants.
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes>
struct FwdTraits {
  static_assert(kDk % 16 == 0 && kDv % 16 == 0, "head dims must be multiples of 16");
  static constexpr bool kCF = kLayout == Layout::kChannelFirst;
  static_assert(kVecBytes == 16 || kVecBytes == 8 || kVecBytes == 4 || kVecBytes == 2,
                "access widths");
  static_assert(kVecBytes == 16 || kCF, "the narrow variants are channel-first only");
  // Keys per K/V tile (the tile choice above says why 64).
  static constexpr int kBlockN = 64;
  // Tiles are stored with the unit-stride global dimension along the row, so each cp.async chunk
  // is 8 contiguous global elements: [token][d] token-major, [d][token] channel-first.
  using QTile = std::conditional_t<kCF, SmemTile<kDk, kBlockM>, SmemTile<kBlockM, kDk>>;
  using KTile = std::conditional_t<kCF, SmemTile<kDk, kBlockN>, SmemTile<kBlockN, kDk>>;
  using VTile = std::conditional_t<kCF, SmemTile<kDv, kBlockN>, SmemTile<kBlockN, kDv>>;
  using OTile = std::conditional_t<kCF, SmemTile<kDv, kBlockM>, SmemTile<kBlockM, kDv>>;
  // One CTA: kThreads threads on kBlockM query rows (launch_row_tiles).
  static constexpr int kCtaThreads = kThreads;
  static constexpr int kRowsPerCta = kBlockM;

  // Layout: Q | K stage 0 | K stage 1 | V stage 0 | V stage 1. The output staging tile reuses
  // the K/V stages once the last tile is consumed (its size is at most that of the two V stages).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + QTile::kBytes;
  static constexpr int kVOffset = kKOffset + 2 * KTile::kBytes;
  static constexpr int kOOffset = kKOffset;
  static constexpr int kSmemBytes = kVOffset + 2 * VTile::kBytes;
  static_assert(OTile::kBytes <= 2 * (KTile::kBytes + VTile::kBytes), "staging fits");
  // Resident CTAs per SM that ptxas must allow (__launch_bounds__). Left alone it spends up to
  // 172 registers at (32, 64), which rounds to 2 CTAs per SM; 3 (<= 168 registers) fits with zero
  // spills up to dv = 64, 4 (<= 128) for dv <= 32. Above dv = 64 the O accumulator alone is 64
  // registers per thread: 2 CTAs (and 2 x 80 KB of shared memory at (128, 128)).
  static constexpr int kMinBlocks = kDv <= 32 ? 4 : (kDv <= 64 ? 3 : 2);
};

template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes>
__global__ void __launch_bounds__(kThreads,
                                  FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes>::kMinBlocks)
    flash_fwd_kernel(const FwdParams params, const float scale_log2) {
  using Tr = FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes>;
  using QTile = typename Tr::QTile;
  using KTile = typename Tr::KTile;
  using VTile = typename Tr::VTile;
  using OTile = typename Tr::OTile;
  constexpr bool kCF = Tr::kCF;
  constexpr int kKSteps = kDk / 16;      // k16 steps of S = Q K^T
  constexpr int kBlockN = Tr::kBlockN;   // keys per K/V tile
  constexpr int kSTiles = kBlockN / 8;   // n8 tiles of S per warp
  constexpr int kPVSteps = kBlockN / 16; // k16 steps of O += P V
  constexpr int kOTiles = kDv / 8;       // n8 tiles of O per warp

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_base = smem_u32(smem);
  const uint32_t sQ = smem_base + Tr::kQOffset;
  const uint32_t sK = smem_base + Tr::kKOffset;
  const uint32_t sV = smem_base + Tr::kVOffset;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int t = lane % 4;   // thread in group
  const int li = lane / 8;  // which 8x8 matrix this lane addresses in an ldmatrix.x4
  const int lr = lane % 8;  // which row of it

  const int N = params.seqlen;
  const int bh = blockIdx.y;
  const int b = bh / params.heads;
  const int h = bh % params.heads;
  const int m0 = blockIdx.x * kBlockM;

  const int n_tiles = (N + kBlockN - 1) / kBlockN;
  const TileSources<Tr, kVecBytes> src(params, b, h, tid);

  // Prologue: Q and K tile 0 form one cp.async group, V tile 0 the next, so the S = Q K^T of
  // tile 0 can start while V is still in flight.
  src.q_copier.copy(sQ, src.q_at(m0), N - m0);
  src.k_copier.copy(sK, src.k, N);
  cp_async_commit();
  src.v_copier.copy(sV, src.v, N);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // Q fragments (A operand, 16 rows of this warp x kDk) stay in registers for the whole loop.
  uint32_t qf[kKSteps][4];
  load_a_fragments<QTile, kCF>(qf, sQ, warp, lane);

  float o[kOTiles][4];
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Running max (log2 units, scale folded in) of rows g and g+8, and this thread's partial row
  // sums; the partial sums are reduced across the 4 threads of a row only once, at the end,
  // which is valid because all four see the same max and hence the same rescale factors.
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j & 1;
    const int n0 = j * kBlockN;
    if (j > 0) {
      // K tile j landed (only V tile j may still be pending). The barrier also tells that every
      // warp finished tile j-1, so its stage may be refilled below.
      cp_async_wait<1>();
      __syncthreads();
    }
    // Prefetch tile j+1 into the other stage; the groups are committed even when empty so the
    // wait counts above and below stay the same on the last tile.
    if (j + 1 < n_tiles) {
      src.k_copier.copy(sK + (stage ^ 1) * KTile::kBytes, src.k_at(n0 + kBlockN),
                        N - n0 - kBlockN);
    }
    cp_async_commit();
    if (j + 1 < n_tiles) {
      src.v_copier.copy(sV + (stage ^ 1) * VTile::kBytes, src.v_at(n0 + kBlockN),
                        N - n0 - kBlockN);
    }
    cp_async_commit();

    // ---- S = Q K^T (raw scores, 16 x kBlockN per warp) ----
    const uint32_t sKs = sK + stage * KTile::kBytes;
    float s[kSTiles][4];
    warp_scores<KTile, kCF, kDtype>(s, qf, sKs, lane);

    // ---- Keys past N -inf, then the online softmax (mma_softmax.cuh) ----
    mma_softmax::mask_keys_from(s, n0, N, t);
    mma_softmax::online_softmax_tile(s, row_max, row_sum, o, scale_log2);

    // V tile j landed (K/V of tile j+1 may be pending); the barrier publishes it to all warps.
    cp_async_wait<2>();
    __syncthreads();

    // ---- O += P V ----
    const uint32_t sVs = sV + stage * VTile::kBytes;
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) {
      uint32_t pf[4];
      pack_a_fragment<kDtype>(pf, s, kk);
#pragma unroll
      for (int p = 0; p < kOTiles / 2; ++p) {
        // b[0], b[1]: (keys lo, keys hi) of dv tile 2p; b[2], b[3]: the same for dv tile 2p+1.
        uint32_t bf[4];
        if constexpr (kCF) {
          // Stored [dv][n] = B^T: plain ldmatrix gives the "col" fragment.
          const int row = p * 16 + (li / 2) * 8 + lr;
          const int chunk = kk * 2 + (li % 2);
          ldsm_x4(bf, sVs + 2u * VTile::offset(row, chunk));
        } else {
          // Stored [n][dv] = B (k rows): transpose 8 keys x 8 dv per block.
          const int row = kk * 16 + (li % 2) * 8 + lr;
          const int chunk = p * 2 + (li / 2);
          ldsm_x4_trans(bf, sVs + 2u * VTile::offset(row, chunk));
        }
        mma_16816<kDtype>(o[2 * p], pf, bf[0], bf[1]);
        mma_16816<kDtype>(o[2 * p + 1], pf, bf[2], bf[3]);
      }
    }
  }

  // ---- Epilogue ----
  // All warps are done with the K/V stages (which the staging tile reuses); the remaining
  // cp.async groups are empty.
  cp_async_wait<0>();
  __syncthreads();
  store_out_lse<Tr, kDtype, kVecBytes>(params, o, row_max, row_sum, smem, bh, m0);
}

// ---------------------------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------------------------
// kKernel (this file's or the sm_90 one, with Tr's shared memory and CTA size) on the grid of
// Tr::kRowsPerCta-row tiles.
template <class Tr, auto kKernel>
void launch_row_tiles(const FwdParams& params, cudaStream_t stream) {
  const int bh = params.batch * params.heads;
  if (params.seqlen <= 0 || bh <= 0) return;
  constexpr int smem = Tr::kSmemBytes;
  if constexpr (smem > 48 * 1024) allow_dynamic_smem_once<kKernel>(smem);
  kKernel<<<row_tile_grid(params.seqlen, Tr::kRowsPerCta, bh), Tr::kCtaThreads, smem, stream>>>(
      params, softmax_scale_log2(params.scale));
}

template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes>
void launch(const FwdParams& params, cudaStream_t stream) {
  launch_row_tiles<FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes>,
                   flash_fwd_kernel<kDtype, kDk, kDv, kLayout, kVecBytes>>(params, stream);
}

}  // namespace flash_fwd_detail

// Instantiated in instances/sm80_fwd_*.cu. The caller checks for launch errors.
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes>
void launch_fwd_sm80(const FwdParams& params, cudaStream_t stream) {
  flash_fwd_detail::launch<kDtype, kDk, kDv, kLayout, kVecBytes>(params, stream);
}

}  // namespace psa_fa2
