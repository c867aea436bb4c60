// The PTX that the mma.sync-era kernels share (the bf16 / fp16 forward and backward, the fp32
// FFMA and TF32 kernels, and the Hopper kernels' mma.sync and cp.async parts): shared-memory
// addresses, cp.async, ldmatrix, mma.sync m16n8k16 and the MUFU exp2. One copy, so that every
// kernel issues them the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../attention_params.h"

namespace psa_fa2 {
namespace ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kBytes (16, 8 or 4) async copy global -> shared, dst and src aligned to kBytes; bytes past
// src_bytes (0 <= src_bytes <= kBytes) are zero-filled, so masked tails read nothing from
// global memory. .cg (L2 only) exists for 16-byte copies alone; 8 and 4 bytes must use .ca.
// The "memory" clobbers keep the compiler from moving shared-memory accesses across a copy's
// issue or its wait.
template <int kBytes>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int src_bytes) {
  static_assert(kBytes == 16 || kBytes == 8 || kBytes == 4, "cp.async sizes");
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}
// The same into the shared-memory element dst, from the global element src.
template <int kBytes, typename T>
__device__ __forceinline__ void cp_async(T* dst, const T* src, int src_bytes) {
  cp_async<kBytes>(smem_u32(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ldmatrix x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, which lands in r[i].
// Thread t receives row t/4, columns 2(t%4), 2(t%4)+1 of each matrix; with .trans, of its
// transpose. The "memory" clobber orders these reads after the __syncthreads that publish the
// cp.async data.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A B for one 16x8x16 block of kDtype (bf16 or fp16) inputs, fp32 accumulators.
// Fragments (g = lane/4, t = lane%4):
//   A: a[0] = (row g,   k 2t..2t+1), a[1] = (row g+8, k 2t..), a[2] = (row g, k 2t+8..),
//      a[3] = (row g+8, k 2t+8..)
//   B: b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g)
//   C: c[0..1] = (row g, cols 2t, 2t+1), c[2..3] = (row g+8, cols 2t, 2t+1)
// Not volatile: a pure register op, which the scheduler may interleave freely.
template <DType kDtype>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kDtype == DType::kBFloat16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x on the MUFU (ex2.approx.ftz.f32, max error ~2 ulp). exp2f compiles to the same MUFU.EX2
// wrapped in an input and output rescale that keeps subnormal results (3 more instructions per
// exp); the softmax's arguments are s - max <= 0 against a row sum >= 1, so flushing a result
// below 2^-126 changes no output bit that matters. ex2(-inf) = +0 and ex2(NaN) = NaN, which the
// softmax relies on.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ptx
}  // namespace psa_fa2
