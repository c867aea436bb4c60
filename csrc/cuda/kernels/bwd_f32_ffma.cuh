// FlashAttention-2 backward for float32 inputs, exact fp32 arithmetic (FFMA), schedule (a) of
// bwd_sm80.cuh: each CTA owns kBlockN = 64 keys of one (batch, head), keeps their dK
// and dV in registers and streams the query rows in steps of kBlockM = 32; dQ is added to the
// fp32 dq with atomics (no conversion pass; launch.cpp passes a zeroed dq of its own
// where the op accumulates, and adds it once).
//
// Per step, with P^T = exp2(S^T scale log2 e - lse log2 e) and dS^T = P^T o (dP^T - D):
//   S^T  = K Q^T, dP^T = V dO^T      [64 keys][32 rows]: 4 keys x 4 rows per thread
//   dV  += P^T dO                    [64 keys][dv]:      4 keys x dv / 8 channels
//   dK  += dS^T Q                    [64 keys][dk]:      4 keys x dk / 8 channels
//   dQ   = dS K                      [32 rows][dk]:      2 rows x dk / 8 channels
// Each product reads both operands from shared memory as float4 (float2) rows along its output
// dimensions, so every operand is kept in the orientation its product reads: K as [d][key] and
// [key][d], Q and dO as [channel][row] and [row][channel], P as [row][key], dS as [row][key]
// and [key][row]. Within a warp, lane = 4 tx + ty: ty picks 4 of the warp's 16 keys (or 2 of its
// 8 rows), tx 4 of 32 columns, so that each operand load touches at most 128 distinct bytes.
// Rows are padded by 4 floats (16-byte aligned; the transposing copies' writes, a warp taking
// 8 rows x 4 columns, fall in 32 distinct banks).
//
// The copies are 4-byte cp.async whatever the layout (48 per thread and step, against 3584
// FFMA). Q / dO in the orientation of S^T and dP^T, and lse and D, are requested for the next
// step as soon as this step's S^T and dP^T are done, behind dV, dK and dQ; the others after the
// step's last barrier. 89 KB of shared memory: two CTAs per SM on sm_90 (227 KB), one on sm_80
// (164 KB) and sm_86 / sm_89 (99 KB).
//
// The copies advance their addresses rather than recompute them, which by the SASS takes about
// 1400 of a step's 6800 instructions per thread off, leaving about 5300 for 3584 FFMA. The
// kernel then runs at about 40% of the FFMA peak on long rows, and forward + backward in exact
// fp32 ahead of memory-efficient SDPA (docs/performance.md). Not tuned further: larger CTAs or
// micro-tiles (each product loads two float4 per 16 FFMA, and two CTAs of 89 KB are 8 warps per
// SM), vector dQ reductions and a deeper copy pipeline were not tried.
//
// Only CUDA headers and the project's kernel headers are included.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../attention_params.h"
#include "fwd_f32_ffma.cuh"
#include "launch_util.h"
#include "launchers.h"

namespace psa_fa2 {
namespace flash_bwd_f32_detail {

constexpr int kThreads = 128;
constexpr int kBlockN = 64;  // owned keys per CTA
constexpr int kBlockM = 32;  // streamed query rows per step
constexpr int kPad = 4;      // floats of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;

// Shared tiles [rows][cols], row stride cols + kPad, in floats.
template <int kRows, int kCols>
struct Tile {
  static constexpr int kStride = kCols + kPad;
  static constexpr int kFloats = kRows * kStride;
};

template <int kDk, int kDv>
struct SmemPlan {
  static_assert(kDk == 32 && kDv % 32 == 0 && kDv <= 64, "the thread mapping covers dk = 32");
  using Ks = Tile<kDk, kBlockN>;       // K [d][key]    A of S^T
  using Kt = Tile<kBlockN, kDk>;       // K [key][d]    B of dQ
  using Vs = Tile<kDv, kBlockN>;       // V [c][key]    A of dP^T
  using Qs = Tile<kDk, kBlockM>;       // Q [d][row]    B of S^T
  using Qt = Tile<kBlockM, kDk>;       // Q [row][d]    B of dK
  using Os = Tile<kDv, kBlockM>;       // dO [c][row]   B of dP^T
  using Ot = Tile<kBlockM, kDv>;       // dO [row][c]   B of dV
  using Ps = Tile<kBlockM, kBlockN>;   // P, dS [row][key]  A of dV, dK
  using St = Tile<kBlockN, kBlockM>;   // dS [key][row]     A of dQ
  static constexpr int kKs = 0;
  static constexpr int kKt = kKs + Ks::kFloats;
  static constexpr int kVs = kKt + Kt::kFloats;
  static constexpr int kQs = kVs + Vs::kFloats;
  static constexpr int kQt = kQs + Qs::kFloats;
  static constexpr int kOs = kQt + Qt::kFloats;
  static constexpr int kOt = kOs + Os::kFloats;
  static constexpr int kP = kOt + Ot::kFloats;
  static constexpr int kDS = kP + Ps::kFloats;
  static constexpr int kDSt = kDS + Ps::kFloats;
  static constexpr int kLse = kDSt + St::kFloats;  // kBlockM lse, then kBlockM D
  static constexpr int kFloats = kLse + 2 * kBlockM;
  static constexpr int kSmemBytes = kFloats * 4;
  static_assert(kKt % 4 == 0 && kVs % 4 == 0 && kQs % 4 == 0 && kQt % 4 == 0 && kOs % 4 == 0 &&
                    kOt % 4 == 0 && kP % 4 == 0 && kDS % 4 == 0 && kDSt % 4 == 0,
                "16-byte aligned tiles");
};

// The fp32 forward's shared-memory accessors, cp.async and exp2 (MUFU.EX2, subnormal results
// flushed: every argument here is at most about 0).
using flash_fwd_f32_detail::cp_async;
using flash_fwd_f32_detail::cp_async_commit;
using flash_fwd_f32_detail::cp_async_wait;
using flash_fwd_f32_detail::ex2;
using flash_fwd_f32_detail::lds128;
using flash_fwd_f32_detail::lds64;
using flash_fwd_f32_detail::sts128;

// acc[a][col0 + j] += x[a] y[j], a, j < 4: one float4 row of each operand.
template <int kCols>
__device__ __forceinline__ void outer_add(float (&acc)[4][kCols], int col0, float4 x, float4 y) {
  const float xv[4] = {x.x, x.y, x.z, x.w}, yv[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[a][col0 + j] = fmaf(xv[a], yv[j], acc[a][col0 + j]);
}

// One head's tensor: token n, channel c at ptr + n * sn + c * sd.
struct HeadView {
  const float* ptr;
  int64_t sn, sd;
};
__device__ __forceinline__ HeadView head_view(const Strided4& s, int b, int h) {
  return {static_cast<const float*>(s.ptr) + b * s.stride_b + h * s.stride_h, s.stride_n,
          s.stride_d};
}

// Tile [kRows][kCols] of the tokens tok0 .. (along the columns with kTokensAlongCols, else the
// rows) and every channel, zero past token n. kUnitCols: the global unit stride runs along the
// columns, and consecutive lanes take consecutive columns; else a warp takes 8 rows x 4 columns
// (32-byte runs of global memory, 32 distinct banks with rows of cols + 4 floats).
// A thread's elements lie fixed steps apart in the tile, so the loop only advances its source
// and destination: computed from the element index, each 4-byte copy took 38-52 instructions
// (divisions, 64-bit products), about 2000 of a step's 6800 per thread.
template <class T, int kRows, int kCols, bool kTokensAlongCols, bool kUnitCols>
__device__ __forceinline__ void copy_tile(float* s, const HeadView& g, int tok0, int n, int tid) {
  constexpr int kWarps = kThreads / 32, kRowBlocks = kRows / 8;
  static_assert(kRows * kCols % kThreads == 0 && kRows % 8 == 0 && kCols % 4 == 0, "tile shape");
  static_assert(!kUnitCols || kThreads % kCols == 0, "unit columns: each thread keeps its column");
  static_assert(kUnitCols || kWarps % kRowBlocks == 0 || kRowBlocks % kWarps == 0,
                "8 x 4 blocks: the warps tile the row blocks");
  // kReps row blocks per column step where a tile has more row blocks than the CTA warps.
  constexpr int kReps = !kUnitCols && kRowBlocks > kWarps ? kRowBlocks / kWarps : 1;
  constexpr int kSteps = kRows * kCols / kThreads / kReps;
  const int lane = tid % 32, warp = tid / 32;
  const int r = kUnitCols ? tid / kCols : (warp % kRowBlocks) * 8 + lane % 8;
  const int c = kUnitCols ? tid % kCols : (warp / kRowBlocks) * 4 + lane / 8;
  constexpr int dr = kUnitCols ? kThreads / kCols : 0;  // between steps
  constexpr int dc = kUnitCols ? 0 : 4 * (kReps > 1 ? 1 : kWarps / kRowBlocks);
  constexpr int kRepRows = kWarps * 8;  // between reps
  constexpr int dtok = kTokensAlongCols ? dc : dr, dch = kTokensAlongCols ? dr : dc;
  const int64_t rep_step = kRepRows * (kTokensAlongCols ? g.sd : g.sn);
  const int64_t src_step = dtok * g.sn + dch * g.sd;
  int tok = tok0 + (kTokensAlongCols ? c : r);
  const float* src = g.ptr + tok * g.sn + (kTokensAlongCols ? r : c) * g.sd;
  float* dst = s + r * T::kStride + c;
#pragma unroll 1
  for (int it = 0; it < kSteps; ++it) {
#pragma unroll
    for (int rep = 0; rep < kReps; ++rep) {
      const bool ok = tok + (kTokensAlongCols ? 0 : rep * kRepRows) < n;
      cp_async<4>(dst + rep * kRepRows * T::kStride, ok ? src + rep * rep_step : g.ptr, ok ? 4 : 0);
    }
    tok += dtok;
    src += src_step;
    dst += dr * T::kStride + dc;
  }
}

// pieces > 1: the CTAs blockIdx.x = tile * pieces + piece share key tile `tile`, each streaming
// a run of the query rows, and add their dK / dV to dk / dv with atomics (dv zeroed by the
// caller); for grids of fewer CTAs than SMs.
template <int kDk, int kDv, Layout kLayout>
__global__ void __launch_bounds__(kThreads, 2) flash_bwd_f32_kernel(const BwdParams p, int pieces) {
  using L = SmemPlan<kDk, kDv>;
  constexpr bool kCF = kLayout == Layout::kChannelFirst;  // tokens have unit stride
  constexpr int kDvGroups = kDv / 32;

  extern __shared__ float4 bwd_f32_smem4[];
  float* const sm = reinterpret_cast<float*>(bwd_f32_smem4);
  float* const sKs = sm + L::kKs;
  float* const sKt = sm + L::kKt;
  float* const sVs = sm + L::kVs;
  float* const sQs = sm + L::kQs;
  float* const sQt = sm + L::kQt;
  float* const sOs = sm + L::kOs;
  float* const sOt = sm + L::kOt;
  float* const sP = sm + L::kP;
  float* const sDS = sm + L::kDS;
  float* const sDSt = sm + L::kDSt;
  float* const sLse = sm + L::kLse;
  float* const sD = sLse + kBlockM;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int tx = lane / 4, ty = lane % 4;
  const int n = p.seqlen;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int key0 = (blockIdx.x / pieces) * kBlockN;
  const int piece = blockIdx.x % pieces;
  const int all_steps = (n + kBlockM - 1) / kBlockM;
  const int step_begin = piece * all_steps / pieces, step_end = (piece + 1) * all_steps / pieces;
  const HeadView q = head_view(p.q, b, h), k = head_view(p.k, b, h), v = head_view(p.v, b, h);
  const HeadView dout = head_view(p.dout, b, h);
  const float* const lse = static_cast<const float*>(p.lse) + int64_t(bh) * n;
  const float* const delta = static_cast<const float*>(p.delta) + int64_t(bh) * n;

  // This thread's keys (S^T, dP^T, dV, dK): i0 .. i0 + 3; rows of S^T / dP^T: r0 .. r0 + 3;
  // rows of dQ: rq0, rq0 + 1; channels: tx * 4 .. + 3 (of each 32).
  const int i0 = warp * 16 + ty * 4;
  const int r0 = tx * 4;
  const int rq0 = warp * 8 + ty * 2;
  const int c0 = tx * 4;

  auto copy_score_inputs = [&](int str0) {  // Q [d][row], dO [c][row], lse, D
    copy_tile<typename L::Qs, kDk, kBlockM, true, kCF>(sQs, q, str0, n, tid);
    copy_tile<typename L::Os, kDv, kBlockM, true, kCF>(sOs, dout, str0, n, tid);
    if (tid < 2 * kBlockM) {
      const int r = tid % kBlockM, tok = str0 + r;
      const float* src = tid < kBlockM ? lse : delta;
      cp_async<4>(sLse + tid, tok < n ? src + tok : src, tok < n ? 4 : 0);
    }
  };
  auto copy_grad_inputs = [&](int str0) {  // Q [row][d], dO [row][c]
    copy_tile<typename L::Qt, kBlockM, kDk, false, !kCF>(sQt, q, str0, n, tid);
    copy_tile<typename L::Ot, kBlockM, kDv, false, !kCF>(sOt, dout, str0, n, tid);
  };

  copy_tile<typename L::Ks, kDk, kBlockN, true, kCF>(sKs, k, key0, n, tid);
  copy_tile<typename L::Kt, kBlockN, kDk, false, !kCF>(sKt, k, key0, n, tid);
  copy_tile<typename L::Vs, kDv, kBlockN, true, kCF>(sVs, v, key0, n, tid);
  copy_score_inputs(step_begin * kBlockM);
  copy_grad_inputs(step_begin * kBlockM);
  cp_async_commit();

  const float scale = static_cast<float>(p.scale);
  const float scale_log2 = scale * kLog2e;
  bool key_ok[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) key_ok[a] = key0 + i0 + a < n;

  float dv_acc[4][4 * kDvGroups] = {};  // [key][channel g * 4 + j: g * 32 + c0 + j]
  float dk_acc[4][4] = {};              // [key][channel c0 + j]
  for (int step = step_begin; step < step_end; ++step) {
    const int str0 = step * kBlockM;
    cp_async_wait<0>();
    __syncthreads();  // this step's rows landed

    float s[4][4] = {}, dp[4][4] = {};  // [key a][row bb]
#pragma unroll 8
    for (int d = 0; d < kDk; ++d) {
      outer_add(s, 0, lds128(sKs + d * L::Ks::kStride + i0), lds128(sQs + d * L::Qs::kStride + r0));
    }
#pragma unroll 8
    for (int c = 0; c < kDv; ++c) {
      outer_add(dp, 0, lds128(sVs + c * L::Vs::kStride + i0), lds128(sOs + c * L::Os::kStride + r0));
    }
    // P^T and dS^T; keys and rows past N get P = dS = 0 (their zero-filled operands give
    // S = 0, whose exponential against any lse is not 0, and may not be finite; and a NaN of a
    // valid V or dO row would reach them through dP).
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) {
      const int r = r0 + bb;
      const float nl = -sLse[r] * kLog2e, dr = sD[r];
      const bool row_ok = str0 + r < n;
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const bool ok = row_ok && key_ok[a];
        const float pv = ok ? ex2(fmaf(s[a][bb], scale_log2, nl)) : 0.f;
        s[a][bb] = pv;
        dp[a][bb] = ok ? pv * (dp[a][bb] - dr) : 0.f;
      }
      sts128(sP + r * L::Ps::kStride + i0, make_float4(s[0][bb], s[1][bb], s[2][bb], s[3][bb]));
      sts128(sDS + r * L::Ps::kStride + i0,
             make_float4(dp[0][bb], dp[1][bb], dp[2][bb], dp[3][bb]));
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      sts128(sDSt + (i0 + a) * L::St::kStride + r0,
             make_float4(dp[a][0], dp[a][1], dp[a][2], dp[a][3]));
    }
    __syncthreads();  // P, dS stored; every thread is past S^T and dP^T (and lse, D)
    if (step + 1 < step_end) copy_score_inputs(str0 + kBlockM);
    cp_async_commit();

    // dV += P^T dO, dK += dS^T Q over the step's rows, summed apart and then added: one
    // fp32 chain over every row of a long sequence (tens of thousands of rows) loses about
    // sqrt(rows) ulps.
    float dv_step[4][4 * kDvGroups] = {}, dk_step[4][4] = {};
#pragma unroll 4
    for (int r = 0; r < kBlockM; ++r) {
      const float4 pa = lds128(sP + r * L::Ps::kStride + i0);
#pragma unroll
      for (int g = 0; g < kDvGroups; ++g) {
        outer_add(dv_step, g * 4, pa, lds128(sOt + r * L::Ot::kStride + g * 32 + c0));
      }
      outer_add(dk_step, 0, lds128(sDS + r * L::Ps::kStride + i0),
                lds128(sQt + r * L::Qt::kStride + c0));
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int j = 0; j < 4 * kDvGroups; ++j) dv_acc[a][j] += dv_step[a][j];
#pragma unroll
      for (int j = 0; j < 4; ++j) dk_acc[a][j] += dk_step[a][j];
    }
    // dQ of rows rq0, rq0 + 1 over the CTA's keys, added to dq.
    {
      float dq[2][4] = {};
#pragma unroll 8
      for (int i = 0; i < kBlockN; ++i) {
        const float2 da = lds64(sDSt + i * L::St::kStride + rq0);
        const float4 kb = lds128(sKt + i * L::Kt::kStride + c0);
        const float kv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          dq[0][j] = fmaf(da.x, kv[j], dq[0][j]);
          dq[1][j] = fmaf(da.y, kv[j], dq[1][j]);
        }
      }
      float* const dq_head = static_cast<float*>(p.dq.ptr) + b * p.dq.stride_b + h * p.dq.stride_h;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int tok = str0 + rq0 + rr;
        if (tok < n) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            atomicAdd(dq_head + tok * p.dq.stride_n + (c0 + j) * p.dq.stride_d, scale * dq[rr][j]);
          }
        }
      }
    }
    __syncthreads();  // every thread is past dV, dK and dQ: Q / dO [row][...], P and dS are free
    if (step + 1 < step_end) copy_grad_inputs(str0 + kBlockM);
    cp_async_commit();
  }
  cp_async_wait<0>();  // the last (empty) groups

  // dK += scale dS^T Q (dk was zeroed by the caller unless accumulating), dV = P^T dO; shared
  // tiles add both.
  float* const dk_head = static_cast<float*>(p.dk.ptr) + b * p.dk.stride_b + h * p.dk.stride_h;
  float* const dv_head = static_cast<float*>(p.dv.ptr) + b * p.dv.stride_b + h * p.dv.stride_h;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    if (!key_ok[a]) continue;
    const int64_t key = key0 + i0 + a;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float* const dst = dk_head + key * p.dk.stride_n + (c0 + j) * p.dk.stride_d;
      if (pieces > 1) {
        atomicAdd(dst, scale * dk_acc[a][j]);
      } else {
        *dst += scale * dk_acc[a][j];
      }
    }
#pragma unroll
    for (int g = 0; g < kDvGroups; ++g) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float* const dst = dv_head + key * p.dv.stride_n + (g * 32 + c0 + j) * p.dv.stride_d;
        if (pieces > 1) {
          atomicAdd(dst, dv_acc[a][g * 4 + j]);
        } else {
          *dst = dv_acc[a][g * 4 + j];
        }
      }
    }
  }
}

// D = rowsum(dout o out) per (batch, head, token), into p.delta ([B, H, N] contiguous).
template <int kDv>
__global__ void __launch_bounds__(128) bwd_f32_delta_kernel(const BwdParams p) {
  const int tok = blockIdx.x * 128 + threadIdx.x;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  if (tok >= p.seqlen) return;
  const HeadView dout = head_view(p.dout, b, h), out = head_view(p.out, b, h);
  float acc = 0.f;
#pragma unroll 8
  for (int c = 0; c < kDv; ++c) {
    acc = fmaf(dout.ptr[tok * dout.sn + c * dout.sd], out.ptr[tok * out.sn + c * out.sd], acc);
  }
  static_cast<float*>(p.delta)[int64_t(bh) * p.seqlen + tok] = acc;
}

}  // namespace flash_bwd_f32_detail

// Instantiated in instances/sm80_bwd_fp32_*.cu. The caller has zeroed dq and dk unless
// accumulating (and dv where plan.f32_row_pieces > 1), and passes p.delta as [B, H, N] float
// scratch.
template <int kDk, int kDv, Layout kLayout>
void launch_bwd_f32(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  using namespace flash_bwd_f32_detail;
  const int pieces = plan.f32_row_pieces;
  const int bh = p.batch * p.heads;
  if (bh == 0 || p.seqlen == 0) return;
  bwd_f32_delta_kernel<kDv><<<dim3((p.seqlen + 127) / 128, bh), 128, 0, stream>>>(p);
  constexpr auto kernel = flash_bwd_f32_kernel<kDk, kDv, kLayout>;
  constexpr int smem = SmemPlan<kDk, kDv>::kSmemBytes;
  allow_dynamic_smem_once<kernel>(smem);
  dim3 grid = row_tile_grid(p.seqlen, kBlockN, bh);
  grid.x *= pieces;
  kernel<<<grid, kThreads, smem, stream>>>(p, pieces);
}

}  // namespace psa_fa2
