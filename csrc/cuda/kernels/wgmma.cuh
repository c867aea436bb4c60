// Hopper warpgroup MMA (wgmma, sm_90a only) and the shared-memory operand layout it reads.
//
// Only what the Hopper kernels (fwd_sm90.cuh, bwd_sm90.cuh) need:
// D(64 x n, fp32) += A(64 x 16, registers) x B(16 x n, shared memory) for n = 64 and 32, bf16 /
// fp16, issued asynchronously by the 4 warps of a warpgroup. Callers must only instantiate
// these on sm_90a (__CUDA_ARCH_FEAT_SM90_ALL).
//
// Register fragments are those of mma.sync m16n8k16, one 16-row block per warp of the
// warpgroup (warp w owns rows 16w .. 16w + 15; g = lane / 4, t = lane % 4):
//   A (4 x 32 bit): a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, k 2t..), a[2] = (row g,
//       k 2t+8..), a[3] = (row g+8, k 2t+8..);
//   D (n / 8 n8 blocks x 4 floats): d[j][0..1] = (row g, cols 8j+2t, 8j+2t+1), d[j][2..3] =
//       the same columns of row g+8.
// So an accumulator block of scores converts into the A fragment of P exactly as with mma.sync.
//
// B is read from the dense, XOR-swizzled shared tiles of fwd_sm80.cuh (SmemTile): a
// tile with 128-, 64- or 32-byte rows permutes the 16-byte chunks of row r by the same key as
// the wgmma 128-, 64- or 32-byte swizzle modes do for a tile whose 8-row atoms start at
// multiples of 8 rows (1024, 512 or 256 bytes), so wgmma reads them as they are. OperandB gives
// the descriptors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../attention_params.h"

namespace psa_fa2 {
namespace wgmma {

// The B operand of a wgmma read from an SmemTile (rows of kNumCols 16-bit elements along the
// unit-stride global dimension; tile base aligned to its 8-row swizzle atom). kColsAreK: the
// tile's columns run along the k dimension of the product ("K-major"); otherwise along n
// ("MN-major", the transposed form, which wgmma allows for 16-bit types; the n extent of one
// wgmma must then be the whole row, kNumCols, so that n spans exactly one swizzle atom and the
// stride between atoms along n, LBO, is never used: callers assert kNExtent).
//   K-major:  SBO = 8 rows (the next 8 n), LBO unused; a k16 step is 32 bytes along the row.
//   MN-major: SBO = 8 rows (the next 8 k), LBO unused (one atom along n); a k16 step is 16 rows.
template <class Tile, bool kColsAreK>
struct OperandB {
  static constexpr uint32_t kRowBytes = Tile::kNumCols * 2;
  static_assert(kRowBytes == 128 || kRowBytes == 64 || kRowBytes == 32, "a swizzle mode");
  // The n extent of a wgmma reading this operand: MN-major, the whole row; K-major, any
  // multiple of 8 rows (this is the most the tile holds).
  static constexpr int kNExtent = kColsAreK ? Tile::kNumRows : Tile::kNumCols;
  // Descriptor layout types: 1 = 128-byte, 2 = 64-byte, 3 = 32-byte swizzle.
  static constexpr uint64_t kLayoutType = kRowBytes == 128 ? 1 : (kRowBytes == 64 ? 2 : 3);
  static constexpr uint32_t kSBO = 8 * kRowBytes;
  static constexpr uint32_t kLBO = 16;  // unused by these shapes; any non-zero value
  static constexpr uint32_t kKStepBytes = kColsAreK ? 32 : 16 * kRowBytes;
  static constexpr int kTranspose = kColsAreK ? 0 : 1;

  // Descriptor of the k16 slice starting at `addr` (shared-state-space byte address): start
  // address, LBO and SBO in 16-byte units, base offset 0 (atoms are aligned), layout type.
  __device__ __forceinline__ static uint64_t descriptor(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
           (static_cast<uint64_t>(kLBO >> 4) << 16) | (static_cast<uint64_t>(kSBO >> 4) << 32) |
           (kLayoutType << 62);
  }
  // Advancing a descriptor by `bytes` (a multiple of 16) moves its start address only; within
  // a swizzle atom the hardware applies the XOR to the addresses it forms.
  __host__ __device__ static constexpr uint64_t advance(uint32_t bytes) { return bytes >> 4; }
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------
// Orders this thread's register writes before the wgmmas that read them (A fragments,
// accumulators), as PTX requires before the first wgmma of a batch.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending of the committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to
// the async proxy that wgmma reads shared memory through; a barrier must follow.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The registers of an accumulator (or A fragment) of an asynchronous wgmma hold its result only
// after wait_group; the compiler does not know that. Passing them through an empty volatile asm
// right after the wait (volatile asms keep their order) stops it from moving reads before the
// wait, and before an issue, writes after it.
template <int kRows, int kCols>
__device__ __forceinline__ void pin(float (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
  }
}
template <int kRows, int kCols>
__device__ __forceinline__ void pin(uint32_t (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

#define PSA_FA2_WGMMA_D32                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define PSA_FA2_WGMMA_D32_OPERANDS(d)                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])

// D (64 x 64, fp32) = A B + (kAccumulate ? D : 0), A from registers, B from shared memory
// (descriptor b, kTransposeB as OperandB::kTranspose). Asynchronous: D and a must not be
// touched until a wait_group covering the commit group it joins.
template <DType kDtype, bool kAccumulate, int kTransposeB>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4],
                                              uint64_t b) {
  static_assert(kDtype == DType::kBFloat16 || kDtype == DType::kFloat16, "16-bit inputs");
  if constexpr (kDtype == DType::kBFloat16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PSA_FA2_WGMMA_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : PSA_FA2_WGMMA_D32_OPERANDS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kAccumulate)),
          "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " PSA_FA2_WGMMA_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : PSA_FA2_WGMMA_D32_OPERANDS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kAccumulate)),
          "n"(kTransposeB));
  }
}

#define PSA_FA2_WGMMA_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define PSA_FA2_WGMMA_D16_OPERANDS(d)                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])

// The same with n = 32.
template <DType kDtype, bool kAccumulate, int kTransposeB>
__device__ __forceinline__ void mma_m64n32k16(float (&d)[4][4], const uint32_t (&a)[4],
                                              uint64_t b) {
  static_assert(kDtype == DType::kBFloat16 || kDtype == DType::kFloat16, "16-bit inputs");
  if constexpr (kDtype == DType::kBFloat16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " PSA_FA2_WGMMA_D16
        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : PSA_FA2_WGMMA_D16_OPERANDS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kAccumulate)),
          "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " PSA_FA2_WGMMA_D16
        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : PSA_FA2_WGMMA_D16_OPERANDS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kAccumulate)),
          "n"(kTransposeB));
  }
}

// D (64 x kN) with kN = 64 or 32: the product whose n is a head dim (dv in the forward's
// O += P V and the backward's dV += P^T dO), for kernels instantiated at either.
template <int kN, DType kDtype, bool kAccumulate, int kTransposeB>
__device__ __forceinline__ void mma_m64k16(float (&d)[kN / 8][4], const uint32_t (&a)[4],
                                           uint64_t b) {
  static_assert(kN == 64 || kN == 32, "n = 64 or 32");
  if constexpr (kN == 64) {
    mma_m64n64k16<kDtype, kAccumulate, kTransposeB>(d, a, b);
  } else {
    mma_m64n32k16<kDtype, kAccumulate, kTransposeB>(d, a, b);
  }
}

#define PSA_FA2_WGMMA_SS_N16(types)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." types                            \
               " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"           \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),   \
                 "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])                                  \
               : "l"(a), "l"(b), "n"(int(kAccumulate)), "n"(kTransposeA), "n"(kTransposeB))

// D (64 x 16, fp32) = A B + (kAccumulate ? D : 0), A and B from shared memory (descriptors a
// and b; kTransposeA / kTransposeB as OperandB::kTranspose of each).
template <DType kDtype, bool kAccumulate, int kTransposeA, int kTransposeB>
__device__ __forceinline__ void mma_ss_m64n16k16(float (&d)[2][4], uint64_t a, uint64_t b) {
  static_assert(kDtype == DType::kBFloat16 || kDtype == DType::kFloat16, "16-bit inputs");
  if constexpr (kDtype == DType::kBFloat16) {
    PSA_FA2_WGMMA_SS_N16("bf16.bf16");
  } else {
    PSA_FA2_WGMMA_SS_N16("f16.f16");
  }
}

#undef PSA_FA2_WGMMA_D32
#undef PSA_FA2_WGMMA_D32_OPERANDS
#undef PSA_FA2_WGMMA_D16
#undef PSA_FA2_WGMMA_D16_OPERANDS
#undef PSA_FA2_WGMMA_SS_N16

}  // namespace wgmma
}  // namespace psa_fa2
