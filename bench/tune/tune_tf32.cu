// Times compile-time variants of the TF32 forward kernel (tile sizes, CTAs per SM) at the
// PSA shapes, without torch: build one binary per variant (tune_tf32.sh) and compare.
// Prints "shape us TFLOP/s checksum"; the checksum of out must agree across variants.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../csrc/cuda/flash_fwd_tf32_kernel.cuh"

using namespace psa_fa2;

#define CHECK(x)                                                              \
  do {                                                                        \
    cudaError_t e = (x);                                                      \
    if (e != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));            \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Deterministic values in [-2, 2): every variant sees the same inputs.
__global__ void fill(float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = (h & 0xffff) / 16384.0f - 2.0f;
  }
}

template <int kVec>
void run(int B, int H, int N) {
  const int dk = 32, dv = 64, C = 2 * dk + dv;
  const size_t n_qkv = size_t(B) * H * C * N, n_out = size_t(B) * H * dv * N;
  float *qkv, *out;
  float* lse;
  CHECK(cudaMalloc(&qkv, n_qkv * 4));
  CHECK(cudaMalloc(&out, n_out * 4));
  CHECK(cudaMalloc(&lse, size_t(B) * H * N * 4));
  fill<<<1024, 256>>>(qkv, n_qkv);
  FwdParams p{};
  auto view = [&](void* base, int64_t off, int64_t sh) {
    return Strided4{static_cast<float*>(base) + off, sh * H, sh, 1, N};
  };
  p.q = view(qkv, 0, int64_t(C) * N);
  p.k = view(qkv, int64_t(dk) * N, int64_t(C) * N);
  p.v = view(qkv, int64_t(2 * dk) * N, int64_t(C) * N);
  p.out = view(out, 0, int64_t(dv) * N);
  p.lse = lse;
  p.batch = B; p.heads = H; p.seqlen = N; p.head_dim_qk = dk; p.head_dim_v = dv;
  p.scale = 1.0 / 5.656854249492381; p.dtype = DType::kFloat32; p.layout = Layout::kChannelFirst;
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < 3; ++i) launch_flash_fwd_f32<32, 64, Layout::kChannelFirst, kVec, true>(p, 0);
  const int iters = 20;
  CHECK(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) launch_flash_fwd_f32<32, 64, Layout::kChannelFirst, kVec, true>(p, 0);
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  std::vector<float> h(n_out);
  CHECK(cudaMemcpy(h.data(), out, n_out * 4, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (size_t i = 0; i < n_out; i += 7) sum += double(h[i]) * double(i % 13 + 1);
  const double us = ms * 1e3 / iters, flops = 2.0 * B * H * double(N) * N * (dk + dv);
  std::printf("%dx%dx%d vec%d %10.1f us %7.1f TFLOP/s checksum %.6e\n", B, H, N, kVec, us, flops / us * 1e-6, sum);
  cudaFree(qkv); cudaFree(out); cudaFree(lse);
}

int main() {
  run<16>(16, 4, 400);
  run<16>(64, 4, 400);
  run<16>(16, 4, 1600);
  run<16>(8, 4, 6400);
  run<16>(1, 2, 62500);
  return 0;
}
