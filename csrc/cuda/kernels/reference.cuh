// Reference kernels: the seed's design, literally. Grid (N, B*H, 1), one CTA per query
// row, scalar arithmetic in Acc (fp32, or fp64 for float64 inputs). Slow but simple and
// correct for any N, any head dims <= 256 and any strides: the yardstick the fast
// kernels are tested against, and the "seed" row of the benchmark.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "../attention_params.h"
#include "launchers.h"

namespace psa_fa2 {
namespace reference {

// 128 threads: each thread owns one key (or query) of a chunk when scoring, and up to two
// output dims (head dims <= 256) when accumulating.
constexpr int kThreads = 128;
constexpr int kDimsPerThread = 2;

template <typename Acc> __device__ __forceinline__ Acc to_acc(float x) { return x; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(double x) { return x; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__half x) { return __half2float(x); }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(float x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T from_acc(double x) { return x; }

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return logf(x); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }

template <typename T>
__device__ __forceinline__ T* row_ptr(const Strided4& s, int b, int h, int64_t n) {
  return static_cast<T*>(s.ptr) + b * s.stride_b + h * s.stride_h + n * s.stride_n;
}

// Block-wide max / sum over kThreads threads; `scratch` holds one value per warp.
template <typename Acc, bool kMax>
__device__ Acc block_reduce(Acc x, Acc* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Acc y = __shfl_xor_sync(0xffffffffu, x, offset);
    x = kMax ? (y > x ? y : x) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by the previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) x = kMax ? (scratch[w] > x ? scratch[w] : x) : x + scratch[w];
  return x;
}

// dot(a, row) where a is a head-dim vector in shared memory and row a strided tensor row.
template <typename T, typename Acc>
__device__ __forceinline__ Acc dot_row(const Acc* a, const T* row, int64_t stride_d, int d) {
  Acc sum = 0;
  for (int c = 0; c < d; ++c) sum += a[c] * to_acc<Acc>(row[c * stride_d]);
  return sum;
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) fwd_kernel(const __grid_constant__ FwdParams p) {
  extern __shared__ unsigned char smem_raw[];
  Acc* q_row = reinterpret_cast<Acc*>(smem_raw);  // [dk], pre-scaled
  Acc* probs = q_row + p.head_dim_qk;              // [kThreads], this chunk's P
  Acc* scratch = probs + kThreads;                 // [kThreads / 32]

  const int n = blockIdx.x, b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int N = p.seqlen, dk = p.head_dim_qk, dv = p.head_dim_v, tid = threadIdx.x;
  const T* q = row_ptr<T>(p.q, b, h, n);
  for (int c = tid; c < dk; c += kThreads) q_row[c] = to_acc<Acc>(q[c * p.q.stride_d]) * Acc(p.scale);
  __syncthreads();

  const Acc neg_inf = -INFINITY;
  Acc m = neg_inf;   // running max, identical in every thread
  Acc l_part = 0;    // this thread's share of the softmax denominator
  Acc acc[kDimsPerThread] = {0, 0};
  for (int j0 = 0; j0 < N; j0 += kThreads) {
    const int j = j0 + tid;
    const Acc s = j < N ? dot_row<T, Acc>(q_row, row_ptr<T>(p.k, b, h, j), p.k.stride_d, dk) : neg_inf;
    const Acc m_new = fmax(m, block_reduce<Acc, true>(s, scratch));
    // Until a finite score is seen, 0 is the reference point: exp(-inf) = 0, not NaN;
    // an all -inf row ends as 0 / 0 = NaN, as eager softmax gives.
    const Acc m_ref = m_new == neg_inf ? Acc(0) : m_new;
    const Acc alpha = acc_exp(m - m_ref);
    const Acc pj = j < N ? acc_exp(s - m_ref) : Acc(0);
    l_part = l_part * alpha + pj;
    probs[tid] = pj;  // block_reduce's barriers ordered the last chunk's reads before this
    __syncthreads();
    const int count = min(kThreads, N - j0);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) {
      const int c = tid + i * kThreads;
      if (c >= dv) break;
      Acc a = acc[i] * alpha;
      const T* v = row_ptr<T>(p.v, b, h, j0) + c * p.v.stride_d;
      for (int jj = 0; jj < count; ++jj) a += probs[jj] * to_acc<Acc>(v[jj * p.v.stride_n]);
      acc[i] = a;
    }
    m = m_new;
  }
  const Acc l = block_reduce<Acc, false>(l_part, scratch);
  T* out = row_ptr<T>(p.out, b, h, n);
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int c = tid + i * kThreads;
    if (c < dv) out[c * p.out.stride_d] = from_acc<T>(acc[i] / l);
  }
  if (tid == 0) static_cast<Acc*>(p.lse)[int64_t(blockIdx.y) * N + n] = m + acc_log(l);
}

// D_n = sum_d dout_nd * out_nd; one warp per row on the same (N, B*H) grid.
template <typename T, typename Acc>
__global__ void __launch_bounds__(32) delta_kernel(const __grid_constant__ BwdParams p) {
  const int n = blockIdx.x, b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const T* o = row_ptr<T>(p.out, b, h, n);
  const T* g = row_ptr<T>(p.dout, b, h, n);
  Acc sum = 0;
  for (int c = threadIdx.x; c < p.head_dim_v; c += 32)
    sum += to_acc<Acc>(o[c * p.out.stride_d]) * to_acc<Acc>(g[c * p.dout.stride_d]);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x == 0) static_cast<Acc*>(p.delta)[int64_t(blockIdx.y) * p.seqlen + n] = sum;
}

// psa_fa2_backward: the CTA owning row n computes dQ_n over all K rows and dK_n / dV_n over
// all Q rows (valid because N_q == N_k). dq and dk are atomically added (the seed's
// contract: calls on V_lo and V_hi share dq / dk), dv is a plain store.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) bwd_kernel(const __grid_constant__ BwdParams p) {
  const int dk = p.head_dim_qk, dv = p.head_dim_v;
  extern __shared__ unsigned char smem_raw[];
  Acc* q_row = reinterpret_cast<Acc*>(smem_raw);  // [dk]  q_n
  Acc* k_row = q_row + dk;                         // [dk]  k_n
  Acc* g_row = k_row + dk;                         // [dv]  dout_n
  Acc* v_row = g_row + dv;                         // [dv]  v_n
  Acc* ds = v_row + dv;                            // [kThreads] this chunk's dS
  Acc* probs = ds + kThreads;                      // [kThreads] this chunk's P

  const int n = blockIdx.x, b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int N = p.seqlen, tid = threadIdx.x;
  const Acc scale = Acc(p.scale);
  const Acc* lse = static_cast<const Acc*>(p.lse) + int64_t(blockIdx.y) * N;
  const Acc* delta = static_cast<const Acc*>(p.delta) + int64_t(blockIdx.y) * N;
  for (int c = tid; c < dk; c += kThreads) {
    q_row[c] = to_acc<Acc>(row_ptr<T>(p.q, b, h, n)[c * p.q.stride_d]);
    k_row[c] = to_acc<Acc>(row_ptr<T>(p.k, b, h, n)[c * p.k.stride_d]);
  }
  for (int c = tid; c < dv; c += kThreads) {
    g_row[c] = to_acc<Acc>(row_ptr<T>(p.dout, b, h, n)[c * p.dout.stride_d]);
    v_row[c] = to_acc<Acc>(row_ptr<T>(p.v, b, h, n)[c * p.v.stride_d]);
  }
  __syncthreads();

  // dQ_n = scale * sum_j dS_nj k_j, with dS_nj = P_nj (dP_nj - D_n).
  Acc dq[kDimsPerThread] = {0, 0};
  const Acc lse_n = lse[n], delta_n = delta[n];
  for (int j0 = 0; j0 < N; j0 += kThreads) {
    const int j = j0 + tid;
    Acc dsj = 0;
    if (j < N) {
      const Acc pj = acc_exp(dot_row<T, Acc>(q_row, row_ptr<T>(p.k, b, h, j), p.k.stride_d, dk) * scale - lse_n);
      const Acc dpj = dot_row<T, Acc>(g_row, row_ptr<T>(p.v, b, h, j), p.v.stride_d, dv);
      dsj = pj * (dpj - delta_n);
    }
    __syncthreads();  // the previous chunk's reads of ds are done
    ds[tid] = dsj;
    __syncthreads();
    const int count = min(kThreads, N - j0);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) {
      const int c = tid + i * kThreads;
      if (c >= dk) break;
      const T* k = row_ptr<T>(p.k, b, h, j0) + c * p.k.stride_d;
      for (int jj = 0; jj < count; ++jj) dq[i] += ds[jj] * to_acc<Acc>(k[jj * p.k.stride_n]);
    }
  }

  // dK_n = scale * sum_i dS_in q_i and dV_n = sum_i P_in dout_i.
  Acc dkv[kDimsPerThread] = {0, 0}, dvv[kDimsPerThread] = {0, 0};
  for (int i0 = 0; i0 < N; i0 += kThreads) {
    const int i = i0 + tid;
    Acc dsi = 0, pi = 0;
    if (i < N) {
      pi = acc_exp(dot_row<T, Acc>(k_row, row_ptr<T>(p.q, b, h, i), p.q.stride_d, dk) * scale - lse[i]);
      const Acc dpi = dot_row<T, Acc>(v_row, row_ptr<T>(p.dout, b, h, i), p.dout.stride_d, dv);
      dsi = pi * (dpi - delta[i]);
    }
    __syncthreads();
    ds[tid] = dsi;
    probs[tid] = pi;
    __syncthreads();
    const int count = min(kThreads, N - i0);
#pragma unroll
    for (int t = 0; t < kDimsPerThread; ++t) {
      const int c = tid + t * kThreads;
      if (c < dk) {
        const T* q = row_ptr<T>(p.q, b, h, i0) + c * p.q.stride_d;
        for (int ii = 0; ii < count; ++ii) dkv[t] += ds[ii] * to_acc<Acc>(q[ii * p.q.stride_n]);
      }
      if (c < dv) {
        const T* g = row_ptr<T>(p.dout, b, h, i0) + c * p.dout.stride_d;
        for (int ii = 0; ii < count; ++ii) dvv[t] += probs[ii] * to_acc<Acc>(g[ii * p.dout.stride_n]);
      }
    }
  }

#pragma unroll
  for (int t = 0; t < kDimsPerThread; ++t) {
    const int c = tid + t * kThreads;
    if (c < dk) {
      atomicAdd(row_ptr<T>(p.dq, b, h, n) + c * p.dq.stride_d, from_acc<T>(dq[t] * scale));
      atomicAdd(row_ptr<T>(p.dk, b, h, n) + c * p.dk.stride_d, from_acc<T>(dkv[t] * scale));
    }
    if (c < dv) row_ptr<T>(p.dv, b, h, n)[c * p.dv.stride_d] = from_acc<T>(dvv[t]);
  }
}

template <typename T, typename Acc>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  const dim3 grid(p.seqlen, p.batch * p.heads, 1);
  const size_t smem = sizeof(Acc) * (p.head_dim_qk + kThreads + kThreads / 32);
  fwd_kernel<T, Acc><<<grid, kThreads, smem, stream>>>(p);
}

template <typename T, typename Acc>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  const dim3 grid(p.seqlen, p.batch * p.heads, 1);
  delta_kernel<T, Acc><<<grid, 32, 0, stream>>>(p);
  const size_t smem = sizeof(Acc) * (2 * p.head_dim_qk + 2 * p.head_dim_v + 2 * kThreads);
  bwd_kernel<T, Acc><<<grid, kThreads, smem, stream>>>(p);
}

}  // namespace reference

// Instantiated in instances/reference_*.cu, one element type each.
template <typename T> struct AccumulateType { using type = float; };
template <> struct AccumulateType<double> { using type = double; };

template <typename T>
void launch_reference_fwd(const FwdParams& p, cudaStream_t stream) {
  reference::launch_fwd<T, typename AccumulateType<T>::type>(p, stream);
}

template <typename T>
void launch_reference_bwd(const BwdParams& p, cudaStream_t stream) {
  reference::launch_bwd<T, typename AccumulateType<T>::type>(p, stream);
}

}  // namespace psa_fa2
