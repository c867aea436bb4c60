// Fast tensor-core backward of softmax attention (FlashAttention-2 tiling).
//
// Two schedules share one tile engine (`owner_pass`):
//   kAtomicDQ  — FlashAttention-2: a CTA owns a K/V row tile, streams every Q tile,
//                keeps dK/dV in fp32 registers and adds its dQ partials to an fp32
//                workspace with red.global.add; a small kernel then does dq += scale*dQ.
//   kCombined  — a CTA owns row tile r, computes dK_r/dV_r over all Q tiles, then dQ_r
//                over all K tiles (S and dP recomputed). Every output element is written
//                by exactly one CTA in a fixed order, so it needs no atomics and is
//                bit-reproducible.
// Both are preceded by a preprocess kernel: D = rowsum(dO * O) (and, for kAtomicDQ,
// zeroing of the fp32 dQ workspace).
//
// Conventions (mma.sync.m16n8k16, row.col): lane = 4*g + t. A fragment (16x16, m x k):
// a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). B (16x8, k x n):
// b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g). C (16x8 fp32): c0,c1 = (g, 2t..2t+1),
// c2,c3 = (g+8, 2t..2t+1). Two adjacent C tiles, rounded to 16 bit, are exactly an A
// fragment, which is why P and dS never leave registers on their way into the next MMA.
//
// Shared-memory tiles are kept in the global layout ("native"): token-major tiles as
// [token][d], channel-first tiles as [d][token], rows padded by 8 elements (16 B) so the
// eight 16-byte rows read by one ldmatrix phase fall into distinct banks. Which operands
// need ldmatrix.trans then follows from the layout alone (see ldsm_tok_d / ldsm_d_tok).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../attention_params.h"
#include "bwd_copy_width.h"
#include "launch_util.h"
#include "launchers.h"
#include "mma_softmax.cuh"
#include "mma_sync_ptx.cuh"
#include "stream_tile_images.h"

namespace psa_fa2 {
namespace fbwd {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------
template <DType kDT> struct ElemOf;
template <> struct ElemOf<DType::kBFloat16> { using type = __nv_bfloat16; };
template <> struct ElemOf<DType::kFloat16> { using type = __half; };

__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16*) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half*) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return pack2(lo, hi, static_cast<T*>(nullptr));
}
__device__ __forceinline__ float2 unpack2(uint32_t u, __nv_bfloat16*) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
}
__device__ __forceinline__ float2 unpack2(uint32_t u, __half*) {
  return __half22float2(*reinterpret_cast<__half2*>(&u));
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  return unpack2(u, static_cast<T*>(nullptr));
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

// ---------------------------------------------------------------------------------------
// PTX wrappers (mma_sync_ptx.cuh), in this kernel's terms of element pointers and types
// ---------------------------------------------------------------------------------------
using ptx::cp_async;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::smem_u32;

template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  if constexpr (kTrans) {
    ptx::ldsm_x4_trans(r, addr);
  } else {
    ptx::ldsm_x4(r, addr);
  }
}

template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  ptx::mma_16816<std::is_same_v<T, __half> ? DType::kFloat16 : DType::kBFloat16>(d, a, b0, b1);
}

using mma_softmax::ex2;

// Adds 4 contiguous floats (16-byte aligned). sm_90 has a vector reduction: one L2
// transaction instead of four, which is what makes the dQ atomics cheap there.
__device__ __forceinline__ void red_add4(float* addr, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(addr), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(addr + 0, a);
  atomicAdd(addr + 1, b);
  atomicAdd(addr + 2, c);
  atomicAdd(addr + 3, d);
#endif
}

// The fp32 dQ workspace keeps each row's 16-column groups in the order of the mma.sync C
// fragments rather than by column: 16-byte chunk t of a group holds columns 2t, 2t + 1, 8 + 2t,
// 9 + 2t, which are what lane t of a quad holds of that row in the two n8 fragments of the
// group. Each lane then adds its values with two vector reductions and no shuffles; the dQ
// conversion puts the columns back in order. That measured faster in the wgmma backward than
// pair lanes trading halves first (four shuffles and eight selects per lane and block), while
// halving the bytes (8-byte reductions) gained nothing: issuing them is the cost, not the
// traffic.
__device__ __forceinline__ int dq_fragment_order_column(int chunk_first_column) {
  const int c = chunk_first_column;
  return (c & ~15) + ((c >> 1) & 6);  // the first of columns 2t, 2t + 1, 8 + 2t, 9 + 2t
}

// Adds a warp's 16 x 16 block of dQ (two C fragments: columns col0 .. col0 + 7 and col0 + 8 ..
// col0 + 15, col0 a multiple of 16) to the fp32 workspace in fragment order, whose block
// starts at row0 (rows of kD floats).
template <int kD>
__device__ __forceinline__ void red_add_dq_block(float* row0, const float (&q)[2][4], int col0) {
  static_assert(kD % 16 == 0, "whole 16-column groups");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* const row_g = row0 + g * kD + col0 + 4 * t;
  red_add4(row_g, q[0][0], q[0][1], q[1][0], q[1][1]);
  red_add4(row_g + 8 * kD, q[0][2], q[0][3], q[1][2], q[1][3]);
}

// ---------------------------------------------------------------------------------------
// Shared-memory tiles of kRows tokens x kD channels, in the global layout.
// ---------------------------------------------------------------------------------------
template <int kRows, int kD, bool kTM>
struct Tile {
  static_assert(kRows % 16 == 0 && kD % 16 == 0, "tiles are made of 16x16 MMA blocks");
  // +8 elements: row pitch = 16 B * odd number, so 8 consecutive rows hit 8 distinct
  // 16-byte bank groups (requires the unpadded row length to be a multiple of 16).
  static constexpr int kStride = (kTM ? kD : kRows) + 8;
  static constexpr int kElems = (kTM ? kRows : kD) * kStride;
  __device__ static __forceinline__ int off(int tok, int d) {
    return kTM ? tok * kStride + d : d * kStride + tok;
  }
};

// 16x16 block X[p][q] of a native tile, where p runs over tokens and q over channels,
// as the A-fragment register order {X[0:8,0:8], X[8:16,0:8], X[0:8,8:16], X[8:16,8:16]},
// each lane holding pairs along q. Token-major tiles store X row-major (plain ldmatrix);
// channel-first tiles store X^T (ldmatrix.trans).
// Used as B operand (X = B^T, [n][k]): n-tile 0 = {r0, r2}, n-tile 1 = {r1, r3}.
template <class TileT, bool kTM, typename T>
__device__ __forceinline__ void ldsm_tok_d(const T* s, int tok0, int d0, uint32_t (&r)[4]) {
  const int l = threadIdx.x & 31;
  int tok, d;
  if constexpr (kTM) {
    tok = tok0 + (l & 15);
    d = d0 + (l >> 4) * 8;
  } else {
    tok = tok0 + ((l >> 3) & 1) * 8;
    d = d0 + (l & 7) + ((l >> 4) << 3);
  }
  ldsm_x4<!kTM>(smem_u32(s + TileT::off(tok, d)), r);
}
// Same for X[p][q] with p over channels and q over tokens (the operand needs pairs along
// tokens: B operands whose reduction runs over tokens).
template <class TileT, bool kTM, typename T>
__device__ __forceinline__ void ldsm_d_tok(const T* s, int d0, int tok0, uint32_t (&r)[4]) {
  const int l = threadIdx.x & 31;
  int tok, d;
  if constexpr (kTM) {
    tok = tok0 + (l & 7) + ((l >> 4) << 3);
    d = d0 + ((l >> 3) & 1) * 8;
  } else {
    tok = tok0 + (l >> 4) * 8;
    d = d0 + (l & 15);
  }
  ldsm_x4<kTM>(smem_u32(s + TileT::off(tok, d)), r);
}

// Asynchronously copies tokens [tok0, tok0 + kRows) of one head into a native tile,
// zero-filling tokens >= n (never reading them).
// g: head base pointer; pitch: stride_n (token-major) or stride_d (channel-first).
// gran (channel-first only): bytes every global chunk start is aligned to. A channel-first
// view of a conv output has stride_d = N, so N % 8 != 0 (e.g. 62 500) loses 16-byte
// alignment; 8- and 4-byte cp.async keep those shapes asynchronous, odd N falls back to
// plain 2-byte loads. The branch is uniform across the CTA.
template <class TileT, int kRows, int kD, bool kTM, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t pitch, int tok0, int n,
                                          int gran) {
  if constexpr (kTM) {
    constexpr int kCPR = kD / 8;  // 16-byte chunks per token
#pragma unroll
    for (int c = threadIdx.x; c < kRows * kCPR; c += kThreads) {
      const int r = c / kCPR, d = (c % kCPR) * 8;
      const int tok = tok0 + r;
      const bool ok = tok < n;
      cp_async<16>(s + TileT::off(r, d), ok ? g + tok * pitch + d : g, ok ? 16 : 0);
    }
  } else {
    constexpr int kCPR = kRows / 8;  // 8-element chunks per channel row
#pragma unroll
    for (int c = threadIdx.x; c < kD * kCPR; c += kThreads) {
      const int d = c / kCPR, r = (c % kCPR) * 8;
      const int tok = tok0 + r;
      T* dst = s + TileT::off(r, d);
      const T* src = g + d * pitch + tok;
      if (gran == 16) {
        int left = n - tok;
        left = left < 0 ? 0 : (left > 8 ? 8 : left);
        cp_async<16>(dst, left ? src : g, left * 2);
      } else if (gran >= 4) {
        const int per = gran / 2;  // elements per copy
        for (int e = 0; e < 8; e += per) {
          int left = n - (tok + e);
          left = left < 0 ? 0 : (left > per ? per : left);
          if (gran == 8) {
            cp_async<8>(dst + e, left ? src + e : g, left * 2);
          } else {
            cp_async<4>(dst + e, left ? src + e : g, left * 2);
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = tok + e < n ? src[e] : from_float<T>(0.f);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// fp32 accumulator tiles: registers -> shared (native layout) -> global (+= or =).
// ---------------------------------------------------------------------------------------
template <int kRows, int kD, bool kTM>
struct StageTile {
  // Pads chosen so the fragment stores below are bank-conflict free: token-major writes
  // float2 per lane (pitch = 8 mod 32 words), channel-first writes scalars down columns
  // (pitch = 4 mod 32 words).
  static constexpr int kStride = kTM ? kD + 8 : kRows + 4;
  static constexpr int kElems = (kTM ? kRows : kD) * kStride;
  __device__ static __forceinline__ int off(int tok, int d) {
    return kTM ? tok * kStride + d : d * kStride + tok;
  }
};

// Accumulator acc[kD/8][4] of a warp owning tokens [row0, row0 + 16).
template <class St, int kD, bool kTM>
__device__ __forceinline__ void stage_acc(float* s, const float (&acc)[kD / 8][4], int row0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    const int d = nt * 8 + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = row0 + g + 8 * h;
      if constexpr (kTM) {
        *reinterpret_cast<float2*>(s + St::off(tok, d)) = make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
      } else {
        s[St::off(tok, d)] = acc[nt][2 * h];
        s[St::off(tok, d + 1)] = acc[nt][2 * h + 1];
      }
    }
  }
}

// Writes (accum: adds) scale * staged tile to tokens [tok0, tok0 + kRows) of one head,
// 16 bytes per access along the contiguous dimension (element-wise for channel-first
// tensors that are not 16-byte aligned, see load_tile), tokens >= n untouched.
template <class St, typename T, int kRows, int kD, bool kTM, int kThreads>
__device__ __forceinline__ void store_tile(const float* s, T* g, int64_t pitch, int tok0, int n,
                                           float scale, int gran, bool accum) {
  constexpr int kChunks = kTM ? kRows * (kD / 8) : kD * (kRows / 8);
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    int r, d;  // first element of the chunk (token offset in tile, channel)
    if constexpr (kTM) {
      r = c / (kD / 8);
      d = (c % (kD / 8)) * 8;
    } else {
      d = c / (kRows / 8);
      r = (c % (kRows / 8)) * 8;
    }
    const int tok = tok0 + r;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = scale * s[kTM ? St::off(r, d + e) : St::off(r + e, d)];
    T* dst = kTM ? g + tok * pitch + d : g + d * pitch + tok;
    const bool full = kTM ? tok < n : (tok + 8 <= n && gran == 16);
    if (full) {
      uint4 out;
      uint32_t* o = reinterpret_cast<uint32_t*>(&out);
      if (accum) {
        const uint4 old = *reinterpret_cast<const uint4*>(dst);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&old);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = unpack2<T>(w[e]);
          o[e] = pack2<T>(f.x + v[2 * e], f.y + v[2 * e + 1]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = pack2<T>(v[2 * e], v[2 * e + 1]);
      }
      *reinterpret_cast<uint4*>(dst) = out;
    } else if (!kTM) {
      for (int e = 0; e < 8 && tok + e < n; ++e) {
        const float add = accum ? to_float(dst[e]) : 0.f;
        dst[e] = from_float<T>(add + v[e]);
      }
    }
  }
}

// acc (16 x kBM per warp) += own rows [wrow, wrow + 16) . streamed tile^T, reduced over kD
// channels; B fragments are the streamed tile's [tok][d] (pairs along d). The owned A
// fragments come from registers (kOwnInRegs: a_regs, kD / 16 blocks) or shared memory.
template <typename T, class Own, class Str, bool kTM, int kD, int kBM, bool kOwnInRegs, int kRegBlocks>
__device__ __forceinline__ void own_times_streamed(float (&acc)[kBM / 8][4],
                                                   const uint32_t (&a_regs)[kRegBlocks][4],
                                                   const T* s_own, const T* s_str, int wrow) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4];
    if constexpr (kOwnInRegs) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = a_regs[kk][e];
    } else {
      ldsm_tok_d<Own, kTM>(s_own, wrow, kk * 16, a);
    }
#pragma unroll
    for (int np = 0; np < kBM / 16; ++np) {
      uint32_t bf[4];
      ldsm_tok_d<Str, kTM>(s_str, np * 16, kk * 16, bf);
      mma<T>(acc[2 * np], a, bf[0], bf[2]);
      mma<T>(acc[2 * np + 1], a, bf[1], bf[3]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tile configuration
// ---------------------------------------------------------------------------------------
template <DType kDT, int kDQK_, int kDV_, Layout kL>
struct Config {
  using T = typename ElemOf<kDT>::type;
  static constexpr int kDQK = kDQK_, kDV = kDV_;
  static constexpr bool kTM = kL == Layout::kTokenMajor;
  // One warp per 16 owned rows; 8 warps = 128 owned rows halves the dQ atomics of a
  // 64-row tile and keeps the CTA at one per SM (the accumulators need ~170 regs).
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;  // owned rows per CTA
  // Streamed rows per step: S/dP tiles are 16 x kBlockM fp32 per warp; 64 keeps them at
  // 64 registers for d <= 64, 32 for the wide heads that carry bigger accumulators.
  static constexpr int kBlockM = (kDQK + kDV > 128) ? 32 : 64;
  // Wide heads reload the owned A fragments from shared memory each step instead of
  // pinning them in registers.
  static constexpr bool kOwnInRegs = kDQK + kDV <= 128;
  static constexpr int kPreRows = 64;  // rows per preprocess / convert CTA
  static constexpr int kPadRows = kBlockM > kPreRows ? kBlockM : kPreRows;

  using OwnA = Tile<kBlockN, kDQK, kTM>;
  using OwnB = Tile<kBlockN, kDV, kTM>;
  using StrA = Tile<kBlockM, kDQK, kTM>;
  using StrB = Tile<kBlockM, kDV, kTM>;
  using DS = Tile<kBlockN, kBlockM, true>;  // dS^T: [owned row][streamed row]
  using StageA = StageTile<kBlockN, kDQK, kTM>;
  using StageB = StageTile<kBlockN, kDV, kTM>;

  // Byte offsets inside dynamic shared memory.
  static constexpr size_t kOffOwnA = 0;
  static constexpr size_t kOffOwnB = kOffOwnA + sizeof(T) * OwnA::kElems;
  static constexpr size_t kOffStrA = kOffOwnB + sizeof(T) * OwnB::kElems;
  static constexpr size_t kOffStrB = kOffStrA + 2 * sizeof(T) * StrA::kElems;
  static constexpr size_t kOffLse = kOffStrB + 2 * sizeof(T) * StrB::kElems;
  static constexpr size_t kOffDel = kOffLse + 2 * sizeof(float) * kBlockM;
  static constexpr size_t kOffDS = kOffDel + 2 * sizeof(float) * kBlockM;
  static constexpr size_t kPassBytes = kOffDS;
  static constexpr size_t kPassBytesDS = kOffDS + sizeof(T) * DS::kElems;
  static constexpr size_t kStageBytes =
      sizeof(float) * (StageA::kElems + StageB::kElems);  // dK and dV (or dQ) staged together
  static constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }
  static constexpr size_t kSmemAtomic = cmax(kPassBytesDS, kStageBytes);
  static constexpr size_t kSmemCombined = cmax(kPassBytes, kStageBytes);
  static_assert(kOffOwnB % 16 == 0 && kOffStrA % 16 == 0 && kOffStrB % 16 == 0 &&
                    kOffLse % 16 == 0 && kOffDS % 16 == 0,
                "cp.async / ldmatrix need 16-byte aligned tiles");
  static_assert(kThreads >= 2 * kBlockM, "one thread per lse / D element");
};

// ---------------------------------------------------------------------------------------
// The tile engine.
//   kKVOwner:  own = (K, V) rows, stream = (Q, dO) tiles; accumulates dK (accA), dV (accB).
//   !kKVOwner: own = (Q, dO) rows, stream = (K, V) tiles; accumulates dQ (accA).
// Per streamed tile, warp w (owning rows own0 + 16w .. +16) computes
//   S  = ownA . strA^T, dP = ownB . strB^T      (16 x kBlockM, fp32)
//   P  = exp2(S * scale*log2e - lse*log2e)      (lse of the Q row: column or row index)
//   dS = P * (dP - D)
//   accA += dS . strA ; accB += P . strB        (P, dS stay in registers as A fragments)
// With kAtomicDQ the warp also writes dS^T to shared memory, and after a barrier the CTA
// computes dQ_tile = dS . K_own and reduces it into the fp32 workspace.
// ---------------------------------------------------------------------------------------
template <class C, bool kKVOwner, bool kAtomicDQ>
__device__ __forceinline__ void owner_pass(const BwdParams& p, char* smem, int b, int h, int own0,
                                           float (&accA)[C::kDQK / 8][4],
                                           float (&accB)[C::kDV / 8][4], float* ws, int n_pad,
                                           int gran) {
  using T = typename C::T;
  constexpr bool kTM = C::kTM;
  constexpr int kDQK = C::kDQK, kDV = C::kDV, BM = C::kBlockM, BN = C::kBlockN;
  constexpr int kThreads = C::kThreads;
  using OwnA = typename C::OwnA;
  using OwnB = typename C::OwnB;
  using StrA = typename C::StrA;
  using StrB = typename C::StrB;
  using DS = typename C::DS;

  const int n = p.seqlen;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t bh = int64_t(b) * p.heads + h;

  T* sOwnA = reinterpret_cast<T*>(smem + C::kOffOwnA);
  T* sOwnB = reinterpret_cast<T*>(smem + C::kOffOwnB);
  T* sStrA = reinterpret_cast<T*>(smem + C::kOffStrA);
  T* sStrB = reinterpret_cast<T*>(smem + C::kOffStrB);
  float* sLse = reinterpret_cast<float*>(smem + C::kOffLse);
  float* sDel = reinterpret_cast<float*>(smem + C::kOffDel);
  T* sDS = reinterpret_cast<T*>(smem + C::kOffDS);

  auto head = [&](const Strided4& s) {
    return static_cast<const T*>(s.ptr) + b * s.stride_b + h * s.stride_h;
  };
  auto pitch = [&](const Strided4& s) { return kTM ? s.stride_n : s.stride_d; };
  const Strided4& tOwnA = kKVOwner ? p.k : p.q;
  const Strided4& tOwnB = kKVOwner ? p.v : p.dout;
  const Strided4& tStrA = kKVOwner ? p.q : p.k;
  const Strided4& tStrB = kKVOwner ? p.dout : p.v;
  const T* gOwnA = head(tOwnA);
  const T* gOwnB = head(tOwnB);
  const T* gStrA = head(tStrA);
  const T* gStrB = head(tStrB);
  const int64_t pOwnA = pitch(tOwnA), pOwnB = pitch(tOwnB);
  const int64_t pStrA = pitch(tStrA), pStrB = pitch(tStrB);
  const float* gLse = static_cast<const float*>(p.lse) + bh * n;
  const float* gDel = static_cast<const float*>(p.delta) + bh * n;

  const int n_tiles = (n + BM - 1) / BM;
  auto issue_stream = [&](int it) {
    if (it < n_tiles) {
      const int buf = it & 1, tok0 = it * BM;
      load_tile<StrA, BM, kDQK, kTM, kThreads>(sStrA + buf * StrA::kElems, gStrA, pStrA, tok0, n, gran);
      load_tile<StrB, BM, kDV, kTM, kThreads>(sStrB + buf * StrB::kElems, gStrB, pStrB, tok0, n, gran);
      if constexpr (kKVOwner) {
        // Out-of-range Q rows get lse = D = 0 (finite); their P is masked to 0 below.
        const int i = threadIdx.x;
        if (i < 2 * BM) {
          const int r = i % BM, tok = tok0 + r;
          const bool ok = tok < n;
          float* dst = (i < BM ? sLse : sDel) + buf * BM + r;
          const float* src = i < BM ? gLse : gDel;
          cp_async<4>(dst, ok ? src + tok : src, ok ? 4 : 0);
        }
      }
    }
    cp_async_commit();  // empty groups keep the wait_group arithmetic uniform
  };

  load_tile<OwnA, BN, kDQK, kTM, kThreads>(sOwnA, gOwnA, pOwnA, own0, n, gran);
  load_tile<OwnB, BN, kDV, kTM, kThreads>(sOwnB, gOwnB, pOwnB, own0, n, gran);
  cp_async_commit();
  issue_stream(0);
  issue_stream(1);

  const int wrow = warp * 16;  // first owned row of this warp, tile-relative
  uint32_t aOwnA[C::kOwnInRegs ? kDQK / 16 : 1][4];
  uint32_t aOwnB[C::kOwnInRegs ? kDV / 16 : 1][4];
  cp_async_wait<2>();
  __syncthreads();
  if constexpr (C::kOwnInRegs) {
#pragma unroll
    for (int kk = 0; kk < kDQK / 16; ++kk) ldsm_tok_d<OwnA, kTM>(sOwnA, wrow, kk * 16, aOwnA[kk]);
#pragma unroll
    for (int kk = 0; kk < kDV / 16; ++kk) ldsm_tok_d<OwnB, kTM>(sOwnB, wrow, kk * 16, aOwnB[kk]);
  }

  // Q-row statistics of the owned rows (dQ pass): rows g and g+8 of the warp.
  float own_nl[2] = {0.f, 0.f}, own_del[2] = {0.f, 0.f};
  if constexpr (!kKVOwner) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int tok = own0 + wrow + g + 8 * hh;
      if (tok < n) {
        own_nl[hh] = -gLse[tok] * kLog2e;
        own_del[hh] = gDel[tok];
      }
    }
  }
  const float scale_log2 = float(p.scale) * kLog2e;
  const bool own_tail = own0 + BN > n;

#pragma unroll
  for (int i = 0; i < kDQK / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) accA[i][e] = 0.f;
  if constexpr (kKVOwner) {
#pragma unroll
    for (int i = 0; i < kDV / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) accB[i][e] = 0.f;
  }

  // One streamed tile. kMasked: some owned or streamed row of it is past N. The caller
  // branches once per tile, so the other tiles carry no range checks (ptxas would otherwise
  // turn them into selects on every score).
  auto tile = [&](int it, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int buf = it & 1, str0 = it * BM;
    const T* sA = sStrA + buf * StrA::kElems;
    const T* sB = sStrB + buf * StrB::kElems;
    cp_async_wait<1>();
    __syncthreads();

    float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;

    // S = ownA . strA^T and dP = ownB . strB^T: reductions over channels.
    own_times_streamed<T, OwnA, StrA, kTM, kDQK, BM, C::kOwnInRegs>(s, aOwnA, sOwnA, sA, wrow);
    own_times_streamed<T, OwnB, StrB, kTM, kDV, BM, C::kOwnInRegs>(dp, aOwnB, sOwnB, sB, wrow);

    // P and dS. Zero-filled out-of-range rows give S = 0, whose exp could overflow for
    // extreme lse; masking P by select keeps every value finite.
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      float nl[2], dl[2];
      if constexpr (kKVOwner) {
        const float2 l2 = *reinterpret_cast<const float2*>(sLse + buf * BM + col);
        const float2 d2 = *reinterpret_cast<const float2*>(sDel + buf * BM + col);
        nl[0] = -l2.x * kLog2e;
        nl[1] = -l2.y * kLog2e;
        dl[0] = d2.x;
        dl[1] = d2.y;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float l = kKVOwner ? nl[e & 1] : own_nl[e >> 1];
        const float dd = kKVOwner ? dl[e & 1] : own_del[e >> 1];
        float pv = ex2(fmaf(s[nt][e], scale_log2, l));
        if constexpr (kMasked) {
          const int orow = own0 + wrow + g + 8 * (e >> 1), scol = str0 + col + (e & 1);
          pv = (orow < n && scol < n) ? pv : 0.f;
        }
        s[nt][e] = pv;
        dp[nt][e] = pv * (dp[nt][e] - dd);
      }
    }

    // accB (dV) += P . strB: reduction over streamed tokens, B = strB^T[d][tok].
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t aS[4];
      aS[0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
      aS[1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
      aS[2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      aS[3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      if constexpr (kKVOwner) {
        uint32_t aP[4];
        aP[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        aP[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        aP[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        aP[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < kDV / 16; ++np) {
          uint32_t bf[4];
          ldsm_d_tok<StrB, kTM>(sB, np * 16, kk * 16, bf);
          mma<T>(accB[2 * np], aP, bf[0], bf[2]);
          mma<T>(accB[2 * np + 1], aP, bf[1], bf[3]);
        }
      }
      // accA (dK or dQ) += dS . strA
#pragma unroll
      for (int np = 0; np < kDQK / 16; ++np) {
        uint32_t bf[4];
        ldsm_d_tok<StrA, kTM>(sA, np * 16, kk * 16, bf);
        mma<T>(accA[2 * np], aS, bf[0], bf[2]);
        mma<T>(accA[2 * np + 1], aS, bf[1], bf[3]);
      }
      if constexpr (kAtomicDQ) {
        // dS^T rows (owned) x cols (streamed); 4-byte stores, conflict-free with the pad.
        uint32_t* d0 = reinterpret_cast<uint32_t*>(sDS + DS::off(wrow + g, kk * 16 + 2 * t));
        uint32_t* d8 = reinterpret_cast<uint32_t*>(sDS + DS::off(wrow + g + 8, kk * 16 + 2 * t));
        d0[0] = aS[0];
        d8[0] = aS[1];
        d0[4] = aS[2];
        d8[4] = aS[3];
      }
    }

    // Everyone is done with buffer `buf` (and has written dS): refill it two tiles ahead.
    __syncthreads();
    issue_stream(it + 2);

    if constexpr (kAtomicDQ) {
      // dQ[str0 : str0 + BM] += dS . K_own. The BM x kDQK result is cut into 16x16 units;
      // with fewer units than warps each unit's reduction over owned rows is split so
      // every warp has work (more reds, but only for tiny heads).
      constexpr int kUnits = (BM / 16) * (kDQK / 16);
      constexpr int kUPW = kUnits >= C::kWarps ? kUnits / C::kWarps : 1;  // units per warp
      constexpr int kSplit = kUnits >= C::kWarps ? 1 : C::kWarps / kUnits;
      static_assert(kUnits % C::kWarps == 0 || C::kWarps % kUnits == 0, "dQ work split");
      constexpr int kKSteps = BN / 16 / kSplit;
      const int kbase = (kSplit > 1 ? warp / kUnits : 0) * kKSteps;
#pragma unroll
      for (int uu = 0; uu < kUPW; ++uu) {
        const int u = kSplit > 1 ? warp % kUnits : warp * kUPW + uu;
        const int mt = u / (kDQK / 16), np = u % (kDQK / 16);
        float q[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          const int j0 = (kbase + ks) * 16;
          uint32_t a[4], bf[4];
          // A = dS[i][j] from dS^T[j][i]: transposed load (rows j, 16-byte chunks of i).
          {
            const int jj = j0 + (lane & 7) + ((lane >> 4) << 3);
            const int ii = mt * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4<true>(smem_u32(sDS + DS::off(jj, ii)), a);
          }
          ldsm_d_tok<OwnA, kTM>(sOwnA, np * 16, j0, bf);  // B = K^T[d][j]
          mma<T>(q[0], a, bf[0], bf[2]);
          mma<T>(q[1], a, bf[1], bf[3]);
        }
        red_add_dq_block<kDQK>(ws + (bh * n_pad + str0 + mt * 16) * kDQK, q, np * 16);
      }
    }
  };
  for (int it = 0; it < n_tiles; ++it) {
    if (own_tail || (it + 1) * BM > n) {
      tile(it, std::true_type{});
    } else {
      tile(it, std::false_type{});
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

// D = rowsum(dO * O) for kPreRows rows of one head; zeroes the same rows of the fp32 dQ
// workspace when there is one (rows up to n_pad, so the main kernel's reds need no mask), and
// the grid together zeroes the `extra_vec4` float4s at `extra` (the Hopper kernel's split-tile
// sums and counters).
template <class C>
__global__ void __launch_bounds__(256)
    bwd_preprocess_kernel(const __grid_constant__ BwdParams p, float* ws, int n_pad,
                          float4* extra = nullptr, int extra_vec4 = 0,
                          char* stream_images = nullptr) {
  using T = typename C::T;
  constexpr int R = C::kPreRows, kDV = C::kDV;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * R, n = p.seqlen;
  const T* o = static_cast<const T*>(p.out.ptr) + b * p.out.stride_b + h * p.out.stride_h;
  const T* dO = static_cast<const T*>(p.dout.ptr) + b * p.dout.stride_b + h * p.dout.stride_h;
  float* del = static_cast<float*>(p.delta) + int64_t(bh) * n;

  if constexpr (C::kTM) {
    constexpr int kTPR = kDV / 8;  // threads per row, 16 bytes each
    static_assert(kTPR <= 32 && 32 % kTPR == 0, "a row's threads share a warp");
    const int sub = threadIdx.x % kTPR;
    for (int r = threadIdx.x / kTPR; r < R; r += 256 / kTPR) {
      const int tok = row0 + r;
      float acc = 0.f;
      if (tok < n) {
        const uint4 a = *reinterpret_cast<const uint4*>(o + tok * p.out.stride_n + sub * 8);
        const uint4 c = *reinterpret_cast<const uint4*>(dO + tok * p.dout.stride_n + sub * 8);
        const uint32_t* aw = reinterpret_cast<const uint32_t*>(&a);
        const uint32_t* cw = reinterpret_cast<const uint32_t*>(&c);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = unpack2<T>(aw[e]), y = unpack2<T>(cw[e]);
          acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
        }
      }
#pragma unroll
      for (int off = kTPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (sub == 0 && tok < n) del[tok] = acc;
    }
  } else {
    // Channel-first: consecutive threads take consecutive tokens (coalesced), four
    // channel groups per token reduced through shared memory.
    __shared__ float part[4][R];
    const int r = threadIdx.x % R, grp = threadIdx.x / R;
    static_assert(256 / R == 4, "4 channel groups");
    static_assert(kDV % 4 == 0, "kDV / 4 channels per group");
    const int tok = row0 + r;
    float acc = 0.f;
    if (tok < n) {
      // A trip count known at compile time puts all of a thread's loads in flight at once; the
      // loop from grp in steps of 4 compiled to two pairs per trip and waited on each.
#pragma unroll
      for (int i = 0; i < kDV / 4; ++i) {
        const int d = grp + 4 * i;
        acc = fmaf(to_float(o[d * p.out.stride_d + tok]), to_float(dO[d * p.dout.stride_d + tok]), acc);
      }
    }
    part[grp][r] = acc;
    __syncthreads();
    const float d_row = (part[0][r] + part[1][r]) + (part[2][r] + part[3][r]);
    if (grp == 0 && tok < n) del[tok] = d_row;
    // The Hopper backward's stream images (stream_tile_images.h): this CTA's rows are one step's.
    const int image_steps = stream_image_steps(n);
    if (stream_images != nullptr && grp == 0 && int(blockIdx.x) < image_steps) {
      static_assert(R == kStreamImageTokens, "one step of the stream images per CTA");
      const float* lse = static_cast<const float*>(p.lse) + int64_t(bh) * n;
      float* stats = reinterpret_cast<float*>(
          stream_images +
          (int64_t(bh) * image_steps + blockIdx.x) * stream_image_step_bytes(C::kDQK, kDV) +
          stream_image_stats_offset_bytes(C::kDQK, kDV));
      stats[(r / 2) * 4 + r % 2] = tok < n ? lse[tok] : 0.f;  // rows past N: finite zeros
      stats[(r / 2) * 4 + 2 + r % 2] = tok < n ? d_row : 0.f;
    }
  }

  if (ws != nullptr) {
    float4* z = reinterpret_cast<float4*>(ws + (int64_t(bh) * n_pad + row0) * C::kDQK);
    for (int i = threadIdx.x; i < R * C::kDQK / 4; i += 256) z[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int64_t cta = blockIdx.x + int64_t(blockIdx.y) * gridDim.x;
  for (int64_t i = cta * 256 + threadIdx.x; i < extra_vec4; i += int64_t(gridDim.x) * gridDim.y * 256) {
    extra[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <class C>
__device__ __forceinline__ void epilogue_kv(const BwdParams& p, char* smem, int b, int h, int own0,
                                            const float (&accA)[C::kDQK / 8][4],
                                            const float (&accB)[C::kDV / 8][4], int gran) {
  using T = typename C::T;
  using SA = typename C::StageA;
  using SB = typename C::StageB;
  float* sA = reinterpret_cast<float*>(smem);
  float* sB = sA + SA::kElems;
  __syncthreads();  // all warps are done with the pass' tiles
  const int wrow = (threadIdx.x >> 5) * 16;
  stage_acc<SA, C::kDQK, C::kTM>(sA, accA, wrow);
  stage_acc<SB, C::kDV, C::kTM>(sB, accB, wrow);
  __syncthreads();
  T* gK = static_cast<T*>(p.dk.ptr) + b * p.dk.stride_b + h * p.dk.stride_h;
  T* gV = static_cast<T*>(p.dv.ptr) + b * p.dv.stride_b + h * p.dv.stride_h;
  store_tile<SA, T, C::kBlockN, C::kDQK, C::kTM, C::kThreads>(
      sA, gK, C::kTM ? p.dk.stride_n : p.dk.stride_d, own0, p.seqlen, float(p.scale), gran,
      p.accumulate);
  store_tile<SB, T, C::kBlockN, C::kDV, C::kTM, C::kThreads>(
      sB, gV, C::kTM ? p.dv.stride_n : p.dv.stride_d, own0, p.seqlen, 1.f, gran, false);
}

// Schedule (a): grid (ceil(N / kBlockN), B*H).
template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_atomic_dq_kernel(const __grid_constant__ BwdParams p, float* ws, int n_pad, int gran) {
  extern __shared__ __align__(16) char smem[];
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int own0 = blockIdx.x * C::kBlockN;
  float accA[C::kDQK / 8][4], accB[C::kDV / 8][4];
  owner_pass<C, true, true>(p, smem, b, h, own0, accA, accB, ws, n_pad, gran);
  epilogue_kv<C>(p, smem, b, h, own0, accA, accB, gran);
}

// dq += scale * dQ_ws (dq = ... unless p.accumulate) for kPreRows rows; grid (n_pad / kPreRows, B*H).
template <class C>
__global__ void __launch_bounds__(256) bwd_convert_dq_kernel(const __grid_constant__ BwdParams p,
                                                             const float* ws, int n_pad, int gran) {
  using T = typename C::T;
  constexpr int R = C::kPreRows, kD = C::kDQK;
  using St = StageTile<R, kD, C::kTM>;
  __shared__ __align__(16) float s[St::kElems];
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * R;
  const float* src = ws + (int64_t(bh) * n_pad + row0) * kD;
  for (int i = threadIdx.x; i < R * kD / 4; i += 256) {
    const float4 v = reinterpret_cast<const float4*>(src)[i];
    const int r = (i * 4) / kD, d = (i * 4) % kD;
    // Back from fragment order (red_add_dq_block).
    const int c = dq_fragment_order_column(d);
    s[St::off(r, c)] = v.x;
    s[St::off(r, c + 1)] = v.y;
    s[St::off(r, c + 8)] = v.z;
    s[St::off(r, c + 9)] = v.w;
  }
  __syncthreads();
  T* gQ = static_cast<T*>(p.dq.ptr) + b * p.dq.stride_b + h * p.dq.stride_h;
  store_tile<St, T, R, kD, C::kTM, 256>(s, gQ, C::kTM ? p.dq.stride_n : p.dq.stride_d, row0,
                                        p.seqlen, float(p.scale), gran, p.accumulate);
}

// Schedule (b): grid (ceil(N / kBlockN), B*H); CTA r owns rows [r*kBlockN, (r+1)*kBlockN)
// for dK/dV and then for dQ.
template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_combined_kernel(const __grid_constant__ BwdParams p, int gran) {
  using T = typename C::T;
  extern __shared__ __align__(16) char smem[];
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int own0 = blockIdx.x * C::kBlockN;
  {
    float accA[C::kDQK / 8][4], accB[C::kDV / 8][4];
    owner_pass<C, true, false>(p, smem, b, h, own0, accA, accB, nullptr, 0, gran);
    epilogue_kv<C>(p, smem, b, h, own0, accA, accB, gran);
  }
  __syncthreads();  // the dK/dV stores read the staging area the dQ pass reloads
  float accQ[C::kDQK / 8][4], unused[C::kDV / 8][4];
  owner_pass<C, false, false>(p, smem, b, h, own0, accQ, unused, nullptr, 0, gran);
  using SA = typename C::StageA;
  float* sQ = reinterpret_cast<float*>(smem);
  __syncthreads();
  stage_acc<SA, C::kDQK, C::kTM>(sQ, accQ, (threadIdx.x >> 5) * 16);
  __syncthreads();
  T* gQ = static_cast<T*>(p.dq.ptr) + b * p.dq.stride_b + h * p.dq.stride_h;
  store_tile<SA, T, C::kBlockN, C::kDQK, C::kTM, C::kThreads>(
      sQ, gQ, C::kTM ? p.dq.stride_n : p.dq.stride_d, own0, p.seqlen, float(p.scale), gran,
      p.accumulate);
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------
inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <class C>
inline void launch(const BwdParams& p, BwdSchedule s, cudaStream_t stream) {
  const int bh = p.batch * p.heads, n = p.seqlen;
  if (bh == 0 || n == 0) return;
  const int n_pad = round_up(n, C::kPadRows);
  const int gran = C::kTM ? 16 : channel_first_granularity(p);
  const dim3 grid_rows(n_pad / C::kPreRows, bh);
  const dim3 grid_own((n + C::kBlockN - 1) / C::kBlockN, bh);
  if (s == BwdSchedule::kAtomicDQ) {
    float* ws = static_cast<float*>(p.workspace);
    bwd_preprocess_kernel<C><<<grid_rows, 256, 0, stream>>>(p, ws, n_pad);
    constexpr size_t smem = C::kSmemAtomic;
    psa_fa2::allow_dynamic_smem_once<bwd_atomic_dq_kernel<C>>(smem);
    bwd_atomic_dq_kernel<C><<<grid_own, C::kThreads, smem, stream>>>(p, ws, n_pad, gran);
    bwd_convert_dq_kernel<C><<<grid_rows, 256, 0, stream>>>(p, ws, n_pad, gran);
  } else {
    bwd_preprocess_kernel<C><<<grid_rows, 256, 0, stream>>>(p, nullptr, n_pad);
    constexpr size_t smem = C::kSmemCombined;
    psa_fa2::allow_dynamic_smem_once<bwd_combined_kernel<C>>(smem);
    bwd_combined_kernel<C><<<grid_own, C::kThreads, smem, stream>>>(p, gran);
  }
}

}  // namespace fbwd

// Instantiated in instances/sm80_bwd_*.cu. With the atomic-dQ schedule, p.workspace holds
// the dQ accumulators, fp32 [B * H][N rounded up to 64][dk] (plan_bwd sizes them).
template <DType kDT, int kDQK, int kDV, Layout kL>
void launch_bwd_sm80(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  static_assert(fbwd::Config<kDT, kDQK, kDV, kL>::kPadRows == 64, "plan_bwd's workspace size");
  fbwd::launch<fbwd::Config<kDT, kDQK, kDV, kL>>(p, plan.schedule, stream);
}

}  // namespace psa_fa2
