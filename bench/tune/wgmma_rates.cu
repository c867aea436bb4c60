// Throughput of the Hopper warpgroup MMA by its n extent, without torch: every SM runs one CTA
// of 1-3 warpgroups, each a loop of batches of eight dependent bf16 wgmma m64nNk16 (fp32
// accumulators) into one accumulator, committed and waited for, timed with clock64. A from
// registers ("RS", as the attention kernels' P V and the backward's products) or from shared
// memory ("SS"); B (and A) K-major, 128-byte swizzle.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a bench/tune/wgmma_rates.cu -o wgmma_rates
//   ./wgmma_rates
// Prints FLOP per clock and SM and its share of 4096 (the H200's dense bf16 peak, 989 TFLOP/s at
// 1830 MHz on 132 SMs), per n and warpgroups per SM: whether the n64 / n32 products of the
// kernels (S and P V at n64, the backward's dK at n32) run at the tensor cores' rate.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

// The generated wrappers: D(64 x n) += A(64 x 16) B(16 x n), scale-d 1, no transposes.
__device__ __forceinline__ void mma_rs_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

__device__ __forceinline__ void mma_ss_n32(float (&d)[16], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a_desc), "l"(b_desc));
}

__device__ __forceinline__ void mma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

__device__ __forceinline__ void mma_ss_n64(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc));
}

__device__ __forceinline__ void mma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

__device__ __forceinline__ void mma_ss_n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc));
}

__device__ __forceinline__ void mma_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

__device__ __forceinline__ void mma_ss_n256(float (&d)[128], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a_desc), "l"(b_desc));
}

// K-major operand descriptor of a tile of 128-byte rows (64 bf16 of k) at `addr`, 128-byte
// swizzle: SBO = 8 rows, LBO unused.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// Fills the first `bytes` of shared memory with small bf16 values (not zeros), makes them
// visible to the wgmmas' async proxy, and returns its shared-state-space address.
__device__ __forceinline__ uint32_t fill_operands(unsigned char* smem, int bytes) {
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (i & 0x00ff00ffu);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  uint32_t base;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(base) : "l"(smem));
  return base;
}

constexpr int kBatch = 8;  // wgmmas per commit group: two passes over the tile's four k16 steps

template <int N, bool kSS>
__global__ void __launch_bounds__(384, 1) rate_kernel(long long* cycles, float* sink, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // B: N rows x 128 bytes; A (SS): 64 rows x 128 bytes after it.
  const uint32_t base = fill_operands(smem, (N + 64) * 128);
  const uint64_t b_desc = descriptor(base);
  const uint64_t a_desc = descriptor(base + N * 128);
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u + threadIdx.x + i;
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const uint64_t step = (k % 4) * 2;  // 32 bytes along the row per k16 step
      if constexpr (kSS) {
        if constexpr (N == 32) mma_ss_n32(d, a_desc + step, b_desc + step);
        if constexpr (N == 64) mma_ss_n64(d, a_desc + step, b_desc + step);
        if constexpr (N == 128) mma_ss_n128(d, a_desc + step, b_desc + step);
        if constexpr (N == 256) mma_ss_n256(d, a_desc + step, b_desc + step);
      } else {
        if constexpr (N == 32) mma_rs_n32(d, a, b_desc + step);
        if constexpr (N == 64) mma_rs_n64(d, a, b_desc + step);
        if constexpr (N == 128) mma_rs_n128(d, a, b_desc + step);
        if constexpr (N == 256) mma_rs_n256(d, a, b_desc + step);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (s == 1.2345f) sink[threadIdx.x] = s;  // keeps the products
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}


// Whether the exponentials overlap the products: `tensor_wgs` warpgroups run the n64 loop
// above (RS, or SS with A from shared memory) while `mufu_wgs` more run ex2.approx on 16 independent chains per thread (one MUFU op
// per chain and iteration). Each warpgroup's thread 0 writes its cycles.
template <bool kSS>
__global__ void __launch_bounds__(384, 1)
    mixed_kernel(long long* cycles, float* sink, int tensor_wgs, int tensor_iters, int mufu_iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = fill_operands(smem, 128 * 128);
  const int wg = threadIdx.x / 128;
  long long t0 = 0, t1 = 0;
  if (wg < tensor_wgs) {
    const uint64_t b_desc = descriptor(base);
    uint32_t a[4];
    for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u + threadIdx.x + i;
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    t0 = clock64();
    for (int it = 0; it < tensor_iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if constexpr (kSS) {
          mma_ss_n64(d, descriptor(base + 64 * 128) + (k % 4) * 2, b_desc + (k % 4) * 2);
        } else {
          mma_rs_n64(d, a, b_desc + (k % 4) * 2);
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    t1 = clock64();
    float s = 0.f;
    for (int i = 0; i < 32; ++i) s += d[i];
    if (s == 1.2345f) sink[threadIdx.x] = s;
  } else {
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = -0.001f * (threadIdx.x + i);
    t0 = clock64();
    for (int it = 0; it < mufu_iters; ++it) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float y;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[i]));
        x[i] = y - 1.0f;
      }
    }
    t1 = clock64();
    float s = 0.f;
    for (int i = 0; i < 16; ++i) s += x[i];
    if (s == 1.2345f) sink[threadIdx.x] = s;
  }
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 4 + wg] = t1 - t0;
}

// How long a warpgroup takes to issue a batch of eight n64 products (fence to commit) against
// the batch's whole time (to the wait's return): whether issuing waits for the tensor core.
// `wgs` warpgroups per SM, each timing its own batches.
template <bool kSS>
__global__ void __launch_bounds__(384, 1) issue_kernel(long long* cycles, float* sink, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = fill_operands(smem, 128 * 128);
  const uint64_t b_desc = descriptor(base);
  const uint64_t a_desc = descriptor(base + 64 * 128);
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u + threadIdx.x + i;
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  long long issue = 0, total = 0;
  for (int it = 0; it < iters; ++it) {
    const long long t0 = clock64();
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if constexpr (kSS) {
        mma_ss_n64(d, a_desc + (k % 4) * 2, b_desc + (k % 4) * 2);
      } else {
        mma_rs_n64(d, a, b_desc + (k % 4) * 2);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    const long long t1 = clock64();
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const long long t2 = clock64();
    issue += t1 - t0;
    total += t2 - t0;
  }
  float s = 0.f;
  for (int i = 0; i < 32; ++i) s += d[i];
  if (s == 1.2345f) sink[threadIdx.x] = s;
  if (threadIdx.x % 128 == 0) {
    cycles[2 * (blockIdx.x * 4 + threadIdx.x / 128)] = issue;
    cycles[2 * (blockIdx.x * 4 + threadIdx.x / 128) + 1] = total;
  }
}

#define CHECK(x)                                                          \
  do {                                                                    \
    cudaError_t e = (x);                                                  \
    if (e != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                 \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

template <int N, bool kSS>
void measure(int sms, long long* cycles, float* sink) {
  std::printf("%s n%-3d", kSS ? "SS" : "RS", N);
  const int smem = (N + 64) * 128;
  CHECK(cudaFuncSetAttribute(rate_kernel<N, kSS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem));
  const int iters = 4096;
  for (int wgs = 1; wgs <= 3; ++wgs) {
    rate_kernel<N, kSS><<<sms, 128 * wgs, smem>>>(cycles, sink, 16);  // warm-up
    rate_kernel<N, kSS><<<sms, 128 * wgs, smem>>>(cycles, sink, iters);
    CHECK(cudaDeviceSynchronize());
    long long host[1024];
    CHECK(cudaMemcpy(host, cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
    double mean = 0;
    for (int i = 0; i < sms; ++i) mean += host[i];
    mean /= sms;
    const double flop = double(wgs) * iters * kBatch * 2.0 * 64 * N * 16;
    const double rate = flop / mean;
    std::printf("   %d WG: %6.0f FLOP/clk (%3.0f%%)", wgs, rate, 100.0 * rate / 4096);
  }
  std::printf("\n");
}


// Tensor FLOP per clock and SM of the product warpgroups and MUFU ops per clock and SM of the
// exponential ones (peak 16), each over its own span, alone and together.
template <bool kSS>
void mixed(int sms, long long* cycles, float* sink, int tensor_wgs, int mufu_wgs) {
  const int tensor_iters = tensor_wgs ? 4096 : 0;
  const int mufu_iters = mufu_wgs ? 4096 : 0;
  const int threads = 128 * (tensor_wgs + mufu_wgs);
  mixed_kernel<kSS><<<sms, threads, 128 * 128>>>(cycles, sink, tensor_wgs, 16, 16);
  mixed_kernel<kSS><<<sms, threads, 128 * 128>>>(cycles, sink, tensor_wgs, tensor_iters, mufu_iters);
  CHECK(cudaDeviceSynchronize());
  long long host[4096];
  CHECK(cudaMemcpy(host, cycles, sms * 4 * sizeof(long long), cudaMemcpyDeviceToHost));
  double tensor_cycles = 0, mufu_cycles = 0;
  for (int i = 0; i < sms; ++i) {
    for (int w = 0; w < tensor_wgs + mufu_wgs; ++w) {
      (w < tensor_wgs ? tensor_cycles : mufu_cycles) += double(host[i * 4 + w]);
    }
  }
  std::printf("%s: %d product WG + %d ex2 WG:", kSS ? "SS" : "RS", tensor_wgs, mufu_wgs);
  if (tensor_wgs) {
    tensor_cycles /= sms * tensor_wgs;
    const double rate = tensor_wgs * double(tensor_iters) * kBatch * 2.0 * 64 * 64 * 16 / tensor_cycles;
    std::printf("  products %6.0f FLOP/clk (%3.0f%%) over %8.0f cycles", rate, 100.0 * rate / 4096,
                tensor_cycles);
  }
  if (mufu_wgs) {
    mufu_cycles /= sms * mufu_wgs;
    const double rate = mufu_wgs * 128.0 * mufu_iters * 16 / mufu_cycles;
    std::printf("  ex2 %5.2f per clk (%3.0f%%) over %8.0f cycles", rate, 100.0 * rate / 16, mufu_cycles);
  }
  std::printf("\n");
}

template <bool kSS>
void issue_time(int sms, long long* cycles, float* sink, int wgs) {
  const int iters = 1024;
  issue_kernel<kSS><<<sms, 128 * wgs, 128 * 128>>>(cycles, sink, 16);
  issue_kernel<kSS><<<sms, 128 * wgs, 128 * 128>>>(cycles, sink, iters);
  CHECK(cudaDeviceSynchronize());
  long long host[4096];
  CHECK(cudaMemcpy(host, cycles, sms * 8 * sizeof(long long), cudaMemcpyDeviceToHost));
  double issue = 0, total = 0;
  for (int i = 0; i < sms * 4; ++i) {
    if (i % 4 >= wgs) continue;
    issue += double(host[2 * i]);
    total += double(host[2 * i + 1]);
  }
  issue /= double(sms) * wgs * iters;
  total /= double(sms) * wgs * iters;
  std::printf("%s n64, %d WG per SM: a batch of 8 issued in %6.0f cycles, done in %6.0f\n",
              kSS ? "SS" : "RS", wgs, issue, total);
}
}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* cycles;
  float* sink;
  CHECK(cudaMalloc(&cycles, 4096 * sizeof(long long)));
  CHECK(cudaMalloc(&sink, 512 * sizeof(float)));
  std::printf("# bf16 wgmma m64nNk16, fp32 accumulate; FLOP per clock and SM (share of 4096), %d SMs\n",
              sms);
  measure<32, false>(sms, cycles, sink);
  measure<64, false>(sms, cycles, sink);
  measure<128, false>(sms, cycles, sink);
  measure<256, false>(sms, cycles, sink);
  measure<32, true>(sms, cycles, sink);
  measure<64, true>(sms, cycles, sink);
  measure<128, true>(sms, cycles, sink);
  measure<256, true>(sms, cycles, sink);
  std::printf("# n64 products and ex2 on one SM at once\n");
  mixed<false>(sms, cycles, sink, 0, 1);
  mixed<false>(sms, cycles, sink, 0, 2);
  for (int ss = 0; ss < 2; ++ss) {
    auto run = ss ? mixed<true> : mixed<false>;
    run(sms, cycles, sink, 2, 0);
    run(sms, cycles, sink, 2, 1);
    run(sms, cycles, sink, 1, 1);
    run(sms, cycles, sink, 1, 2);
  }
  std::printf("# issuing against running\n");
  for (int wgs = 1; wgs <= 3; ++wgs) {
    issue_time<false>(sms, cycles, sink, wgs);
    issue_time<true>(sms, cycles, sink, wgs);
  }
  return 0;
}
