// NOTE: part of tune_fwd.cu and tune_bwd.cu, which build against the tree of commit 28fac21
// only (`git checkout 28fac21`; their headers and bench/tune/README.md say why).
// What the tuning binaries (tune_fwd.cu, tune_bwd.cu) share: error checks, seeded inputs, the
// timing loop and the checksum of the outputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                   \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

// In their own namespace: a global to_float(__nv_bfloat16) would meet the kernels' own through
// argument-dependent lookup.
namespace tune {

__device__ __host__ inline float to_float(float x) { return x; }
__device__ __host__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __host__ inline float to_float(__half x) { return __half2float(x); }
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half(x);
}

// Deterministic values in [-2, 2) for each seed: every variant sees the same inputs.
template <class T>
__global__ void fill(T* x, size_t n, uint32_t seed = 0) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = (uint32_t(i) ^ seed) * 2654435761u ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = from_float<T>((h & 0xffff) / 16384.0f - 2.0f);
  }
}

// Mean time of one launch() in us: 3 warm-up calls, then `iters` between two events.
template <class Launch>
double time_us(Launch launch, int iters) {
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < 3; ++i) launch();
  CHECK(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) launch();
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CHECK(cudaEventDestroy(t0));
  CHECK(cudaEventDestroy(t1));
  return ms * 1e3 / iters;
}

// A weighted sum of every 7th of n device values: variants must agree on it up to rounding.
template <class T>
double checksum(const T* device, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (size_t i = 0; i < n; i += 7) sum += double(to_float(h[i])) * double(i % 13 + 1);
  return sum;
}

}  // namespace tune
