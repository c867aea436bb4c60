// Issue rates of the softmax's special-function and conversion instructions on one GPU, without
// torch: every SM runs one CTA of 1-4 warps per sub-partition, each warp a loop of independent
// instructions, timed with clock64.
//   nvcc -O3 -arch=sm_90a bench/tune/mufu_rates.cu -o mufu_rates && ./mufu_rates
// Prints cycles per warp instruction on one sub-partition (SMSP). Measured on sm_90: the MUFU's
// ex2 takes 8 (16 lanes per SM), and so do the roundings an FMA-pipe 2^x might use (FRND, F2I;
// whether on the same pipe, this does not time), while the bf16 packing F2FP takes 4 and does
// not slow ex2 down.
#include <cuda_runtime.h>

#include <cstdio>

namespace {

enum Mode { kEx2, kEx2Pack, kPack, kFrnd, kF2i, kModes };
const char* const kNames[] = {"ex2.approx.ftz.f32", "ex2 + cvt.rn.bf16x2.f32 (1 per 2)",
                              "cvt.rn.bf16x2.f32", "cvt.rni.f32.f32 (FRND)",
                              "cvt.rni.s32.f32 (F2I)"};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned pack(float a, float b) {
  unsigned d;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(a), "f"(b));
  return d;
}

// 16 independent chains per thread; each iteration issues 16 of the timed instructions (8 for
// the packing alone), each chain also taking an FADD that keeps it going.
template <Mode kMode>
__global__ void rate_kernel(float* out, long long* cycles, int iters) {
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = -0.001f * (threadIdx.x + i);
  unsigned acc = 0;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if constexpr (kMode == kEx2 || kMode == kEx2Pack) x[i] = ex2(x[i]) - 1.0f;
      if constexpr (kMode == kFrnd) {
        float r;
        asm volatile("cvt.rni.f32.f32 %0, %1;" : "=f"(r) : "f"(x[i]));
        x[i] = r + 0.5f;
      }
      if constexpr (kMode == kF2i) {
        int r;
        asm volatile("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(x[i]));
        x[i] = __int_as_float(r) + 0.5f;
      }
    }
    if constexpr (kMode == kEx2Pack || kMode == kPack) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc ^= pack(x[2 * i], x[2 * i + 1]);
        if constexpr (kMode == kPack) {
          x[2 * i] += 1e-7f;
          x[2 * i + 1] += 1e-7f;
        }
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += x[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s + acc;
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}

template <Mode kMode>
void launch(int blocks, int threads, float* out, long long* cycles, int iters) {
  rate_kernel<kMode><<<blocks, threads>>>(out, cycles, iters);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  long long* cycles;
  cudaMalloc(&out, size_t(sms) * 512 * sizeof(float));
  cudaMalloc(&cycles, size_t(sms) * 32 * sizeof(long long));
  const int iters = 4096;
  using Launch = void (*)(int, int, float*, long long*, int);
  const Launch launches[] = {launch<kEx2>, launch<kEx2Pack>, launch<kPack>, launch<kFrnd>,
                             launch<kF2i>};
  std::printf("cycles per warp instruction on one SMSP (SMs: %d)\n", sms);
  for (int mode = 0; mode < kModes; ++mode) {
    std::printf("%-36s", kNames[mode]);
    for (int per_smsp = 1; per_smsp <= 4; ++per_smsp) {
      const int warps = 4 * per_smsp;
      for (int rep = 0; rep < 2; ++rep) launches[mode](sms, 32 * warps, out, cycles, iters);
      long long h[32];
      cudaMemcpy(h, cycles, sizeof(h), cudaMemcpyDeviceToHost);  // SM 0's warps
      double mean = 0;
      for (int w = 0; w < warps; ++w) mean += double(h[w]) / warps;
      // Per iteration a warp issues 16 timed instructions, 8 for the packing alone; ex2 +
      // packing is counted as its 16 ex2.
      const double per_warp_instruction = mean / iters / (mode == kPack ? 8 : 16) / per_smsp;
      std::printf("  %d warp%s: %5.2f", per_smsp, per_smsp > 1 ? "s" : " ", per_warp_instruction);
    }
    std::printf("\n");
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
