// The tile math of tile_math.h, compiled once per instruction set: included by
// tile_math_baseline.cpp, tile_math_avx2.cpp and tile_math_avx512.cpp, each defining
// PSA_TILE_ISA (the namespace of its copy), PSA_TILE_TABLE (the TileMath that lists it),
// PSA_TILE_LANES (floats per vector) and, where it is not 16 (x86-64) or 32 (aarch64),
// PSA_TILE_REGISTERS (vector registers). No include guard: it is meant to be compiled once per
// copy.
//
// The vectors are GCC / Clang vector extensions of PSA_TILE_LANES floats, the width of one
// register of the target: 8 in the AVX2 copy, 4 (16 bytes: SSE2 on x86-64, NEON on aarch64)
// in the baseline one. A vector wider than the target's registers is split by the compiler,
// and GCC then keeps the GEMM's accumulators and the softmax's selects in memory
// (docs/cpu_kernels.md, "Instruction sets"). Only <cstdint> is included
// and every helper lives in the per-ISA namespace, so no inline function compiled for AVX2
// can be shared with (and picked by the linker for) baseline code.
#include <cstdint>

#include "tile_math.h"

#if !defined(__GNUC__)
#error "the fused CPU kernels need GCC or Clang vector extensions"
#endif

namespace psa_fa2 {
namespace cpu {
namespace PSA_TILE_ISA {
namespace {

constexpr int kLanes = PSA_TILE_LANES;
static_assert(kCols % kLanes == 0, "a micro-tile's columns are whole vectors");
constexpr int kVecs = kCols / kLanes;  // vectors across one micro-tile's columns

using vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using ivec = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
#define PSA_UNROLL _Pragma("GCC unroll 16")
// Every helper is inlined into the function that calls it: the loops' vector code must
// all be one function's, so that the compiler keeps the vectors in registers.
#define PSA_INLINE inline __attribute__((always_inline))

PSA_INLINE vec load(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
PSA_INLINE void store(float* p, vec v) { __builtin_memcpy(p, &v, sizeof v); }
// x * 1 is x exactly, so this compiles to one broadcast (vbroadcastss); 0 + x would keep an
// add for the sign of -0, and an initializer list builds the vector lane by lane.
PSA_INLINE vec splat(float x) { return (vec{} + 1.f) * x; }
PSA_INLINE vec vmax(vec a, vec b) { return a > b ? a : b; }

// 2^x for x <= 0 (the only arguments the softmax makes), within 2e-7 relative: x = n + f
// with n an integer and |f| <= 1/2, 2^f by a degree-5 polynomial, 2^n put into the exponent.
// Below -125 the result is clamped to 2^-125 rather than going denormal: next to the row's
// largest term, 1, it is nothing. NaN stays NaN.
PSA_INLINE vec exp2v(vec x) {
  x = x < splat(-125.f) ? splat(-125.f) : x;
  const vec magic = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const vec n = (x + magic) - magic;
  const vec f = x - n;
  // Near-minimax for 2^f on [-1/2, 1/2] (relative error 9e-8 in exact arithmetic).
  vec p = splat(1.3264726898977973e-03f);
  p = p * f + 9.6715126605577270e-03f;
  p = p * f + 5.5507337442445875e-02f;
  p = p * f + 2.4022242084919346e-01f;
  p = p * f + 6.9314697759847090e-01f;
  p = p * f + 1.0f;
  const ivec e = __builtin_convertvector(n, ivec) << 23;
  return (vec)((ivec)p + e);
}

// Rows of one micro-tile: as many as fit the target's vector registers beside one row of
// B (kVecs registers) and one broadcast A value, at most 6, or 12 where a row is one vector
// (12 independent FMA chains, as AVX2's 6 rows of 2 make): 6 with AVX2's 16 registers of 8
// floats or aarch64's 32 of 4, 2 with SSE2's 16 of 4, 12 with AVX-512's 32 of 16.
#if defined(PSA_TILE_REGISTERS)
constexpr int kVectorRegisters = PSA_TILE_REGISTERS;
#elif defined(__aarch64__)
constexpr int kVectorRegisters = 32;
#else
constexpr int kVectorRegisters = 16;
#endif
constexpr int kRowsFit = (kVectorRegisters - kVecs - 1) / kVecs;
constexpr int kRowsMax = kVecs == 1 ? 12 : 6;
constexpr int kRows = kRowsFit < kRowsMax ? kRowsFit : kRowsMax;
static_assert(kRows >= 1, "one row of accumulators must fit the registers");

// One MR x (NV vectors) block of C: MR * NV accumulators, one row of B (NV registers) and one
// broadcast A value live in registers. The accumulators start from zero and are added to C at
// the end: a sum over one tile's kdim terms, then one add per tile. Chaining every FMA onto C
// instead makes one sequential sum over all N keys, whose rounding grows with sqrt(N)
// (docs/cpu_kernels.md).
template <int MR, int NV>
PSA_INLINE void micro_tile(int64_t kdim, const float* a, int64_t a_si, int64_t a_sk, const float* b,
                           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  vec acc[MR][NV];
  PSA_UNROLL for (int i = 0; i < MR; ++i) {
    PSA_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = vec{};
  }
  for (int64_t k = 0; k < kdim; ++k) {
    vec bk[NV];
    PSA_UNROLL for (int v = 0; v < NV; ++v) bk[v] = load(b + k * ldb + v * kLanes);
    const float* ak = a + k * a_sk;
    PSA_UNROLL for (int i = 0; i < MR; ++i) {
      const vec ai = splat(ak[i * a_si]);
      PSA_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] += ai * bk[v];
    }
  }
  PSA_UNROLL for (int i = 0; i < MR; ++i) {
    PSA_UNROLL for (int v = 0; v < NV; ++v) {
      float* ci = c + i * ldc + v * kLanes;
      store(ci, accumulate ? load(ci) + acc[i][v] : acc[i][v]);
    }
  }
}

// The last rows (fewer than a full micro-tile's) of a column block: one micro-tile of exactly
// that many.
template <int MR, int NV>
PSA_INLINE void rest_rows(int64_t rows, int64_t kdim, const float* a, int64_t a_si, int64_t a_sk,
                          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR) {
      micro_tile<MR, NV>(kdim, a, a_si, a_sk, b, ldb, c, ldc, accumulate);
    } else {
      rest_rows<MR - 1, NV>(rows, kdim, a, a_si, a_sk, b, ldb, c, ldc, accumulate);
    }
  }
}

// All m rows of one column block of NV vectors: micro-tiles of MR rows, then the rest.
template <int MR, int NV>
PSA_INLINE void column_block(int64_t m, int64_t kdim, const float* a, int64_t a_si, int64_t a_sk,
                             const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + MR <= m; i += MR) {
    micro_tile<MR, NV>(kdim, a + i * a_si, a_si, a_sk, b, ldb, c + i * ldc, ldc, accumulate);
  }
  rest_rows<MR - 1, NV>(m - i, kdim, a + i * a_si, a_si, a_sk, b, ldb, c + i * ldc, ldc,
                        accumulate);
}

// Where a micro-tile's kCols are one vector (AVX-512), column blocks of two vectors where n
// has them: each broadcast A value then feeds two FMAs, so a step of the k loop loads 14
// values for 24 FMAs rather than 13 for 12.
constexpr int kWideVecs = kVecs == 1 ? 2 : kVecs;
constexpr int kWideRowsFit = (kVectorRegisters - kWideVecs - 1) / kWideVecs;
constexpr int kWideRows = kWideRowsFit < 12 ? kWideRowsFit : 12;

}  // namespace

void gemm_tile(int64_t m, int64_t n, int64_t kdim, const float* a, int64_t a_si, int64_t a_sk,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // Column blocks outside, row blocks inside: one B column block ([kdim][columns]) stays in
  // L1 while every row block of A streams past it.
  int64_t j = 0;
  if constexpr (kWideVecs != kVecs) {
    for (; j + kWideVecs * kLanes <= n; j += kWideVecs * kLanes) {
      column_block<kWideRows, kWideVecs>(m, kdim, a, a_si, a_sk, b + j, ldb, c + j, ldc,
                                         accumulate);
    }
  }
  for (; j < n; j += kCols) {
    column_block<kRows, kVecs>(m, kdim, a, a_si, a_sk, b + j, ldb, c + j, ldc, accumulate);
  }
}

void softmax_update(int64_t nk, int64_t ncols, float* s, float* m, float* l, float* alpha) {
  // One micro-tile of columns (kVecs vectors) at a time down the whole tile: the running
  // maxima and sums stay in registers, and the kVecs exp2 chains overlap.
  const vec neg_inf = splat(-__builtin_inff());
  for (int64_t c = 0; c < ncols; c += kCols) {
    vec m_old[kVecs], mx[kVecs], ref[kVecs], sum[kVecs];
    PSA_UNROLL for (int v = 0; v < kVecs; ++v) {
      m_old[v] = load(m + c + v * kLanes);
      mx[v] = m_old[v];
      sum[v] = vec{};
    }
    for (int64_t j = 0; j < nk; ++j) {
      PSA_UNROLL for (int v = 0; v < kVecs; ++v) {
        mx[v] = vmax(mx[v], load(s + j * ncols + c + v * kLanes));
      }
    }
    // A column whose maximum is still -inf (only -inf scores so far) takes 0 as its
    // reference, so that exp2(-inf - 0) = 0 rather than NaN; its final 0 / 0 = NaN is eager
    // softmax's.
    PSA_UNROLL for (int v = 0; v < kVecs; ++v) ref[v] = mx[v] == neg_inf ? vec{} : mx[v];
    for (int64_t j = 0; j < nk; ++j) {
      float* row = s + j * ncols + c;
      PSA_UNROLL for (int v = 0; v < kVecs; ++v) {
        const vec p = exp2v(load(row + v * kLanes) - ref[v]);
        store(row + v * kLanes, p);
        sum[v] += p;
      }
    }
    PSA_UNROLL for (int v = 0; v < kVecs; ++v) {
      const int64_t cv = c + v * kLanes;
      const vec a = exp2v(m_old[v] - ref[v]);
      store(l + cv, load(l + cv) * a + sum[v]);
      store(m + cv, mx[v]);
      store(alpha + cv, a);
    }
  }
}

void exp2_minus(int64_t nk, int64_t ncols, float* s, const float* lse2) {
  for (int64_t j = 0; j < nk; ++j) {
    float* row = s + j * ncols;
    for (int64_t c = 0; c < ncols; c += kLanes) {
      store(row + c, exp2v(load(row + c) - load(lse2 + c)));
    }
  }
}

void softmax_grad(int64_t nk, int64_t ncols, const float* p, float* dp, const float* delta) {
  for (int64_t j = 0; j < nk; ++j) {
    const float* prow = p + j * ncols;
    float* drow = dp + j * ncols;
    for (int64_t c = 0; c < ncols; c += kLanes) {
      store(drow + c, load(prow + c) * (load(drow + c) - load(delta + c)));
    }
  }
}

void scale_columns(int64_t rows, int64_t ncols, float* x, const float* f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ncols;
    for (int64_t c = 0; c < ncols; c += kLanes) store(row + c, load(row + c) * load(f + c));
  }
}

}  // namespace PSA_TILE_ISA

extern const TileMath PSA_TILE_TABLE = {PSA_TILE_ISA::gemm_tile, PSA_TILE_ISA::softmax_update,
                                        PSA_TILE_ISA::exp2_minus, PSA_TILE_ISA::softmax_grad,
                                        PSA_TILE_ISA::scale_columns};

}  // namespace cpu
}  // namespace psa_fa2
