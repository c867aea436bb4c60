// The tile math of tile_math.h, compiled once per instruction set: included by
// tile_math_baseline.cpp and tile_math_avx2.cpp, each defining PSA_TILE_ISA (the namespace
// of its copy) and PSA_TILE_TABLE (the TileMath that lists it). No include guard: it is
// meant to be compiled twice.
//
// The vectors are GCC / Clang vector extensions of 8 floats. Where the target has 32-byte
// vectors (the AVX2 file) each is one register; elsewhere the compiler splits it. Only
// <cstdint> is included and every helper lives in the per-ISA namespace, so no inline
// function compiled for AVX2 can be shared with (and picked by the linker for) baseline code.
#include <cstdint>

#include "tile_math.h"

#if !defined(__GNUC__)
#error "the fused CPU kernels need GCC or Clang vector extensions"
#endif

// The helpers pass 32-byte vectors by value between inline functions of one file, so the
// ABI note GCC gives for the baseline copy does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace psa_fa2 {
namespace cpu {
namespace PSA_TILE_ISA {
namespace {

using vec8 = float __attribute__((vector_size(32)));
using ivec8 = int32_t __attribute__((vector_size(32)));
#define PSA_UNROLL _Pragma("GCC unroll 16")
// Every helper is inlined into the function that calls it: the loops' vector code must
// all be one function's, so that the compiler keeps the vectors in registers.
#define PSA_INLINE inline __attribute__((always_inline))

PSA_INLINE vec8 load(const float* p) {
  vec8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
PSA_INLINE void store(float* p, vec8 v) { __builtin_memcpy(p, &v, sizeof v); }
// x * 1 is x exactly, so this compiles to one broadcast (vbroadcastss); 0 + x would keep an
// add for the sign of -0, and an initializer list builds the vector lane by lane.
PSA_INLINE vec8 splat(float x) { return vec8{1, 1, 1, 1, 1, 1, 1, 1} * x; }
PSA_INLINE vec8 vmax(vec8 a, vec8 b) { return a > b ? a : b; }

// 2^x for x <= 0 (the only arguments the softmax makes), within 2e-7 relative: x = n + f
// with n an integer and |f| <= 1/2, 2^f by a degree-5 polynomial, 2^n put into the exponent.
// Below -125 the result is clamped to 2^-125 rather than going denormal: next to the row's
// largest term, 1, it is nothing. NaN stays NaN.
PSA_INLINE vec8 exp2v(vec8 x) {
  x = x < splat(-125.f) ? splat(-125.f) : x;
  const vec8 magic = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const vec8 n = (x + magic) - magic;
  const vec8 f = x - n;
  // Near-minimax for 2^f on [-1/2, 1/2] (relative error 9e-8 in exact arithmetic).
  vec8 p = splat(1.3264726898977973e-03f);
  p = p * f + 9.6715126605577270e-03f;
  p = p * f + 5.5507337442445875e-02f;
  p = p * f + 2.4022242084919346e-01f;
  p = p * f + 6.9314697759847090e-01f;
  p = p * f + 1.0f;
  const ivec8 e = __builtin_convertvector(n, ivec8) << 23;
  return (vec8)((ivec8)p + e);
}

// One MR x 16 block of C: 2 * MR accumulators, two B vectors and one broadcast A value live
// in registers (15 of AVX2's 16 at MR = 6). The accumulators start from zero and are added
// to C at the end: a sum over one tile's kdim terms, then one add per tile. Chaining every
// FMA onto C instead makes one sequential sum over all N keys, whose rounding grows with
// sqrt(N) (docs/cpu_kernels.md).
template <int MR>
PSA_INLINE void micro_tile(int64_t kdim, const float* a, int64_t a_si, int64_t a_sk, const float* b,
                           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  vec8 c0[MR], c1[MR];
  PSA_UNROLL for (int i = 0; i < MR; ++i) {
    c0[i] = vec8{};
    c1[i] = vec8{};
  }
  for (int64_t k = 0; k < kdim; ++k) {
    const vec8 b0 = load(b + k * ldb), b1 = load(b + k * ldb + 8);
    const float* ak = a + k * a_sk;
    PSA_UNROLL for (int i = 0; i < MR; ++i) {
      const vec8 ai = splat(ak[i * a_si]);
      c0[i] += ai * b0;
      c1[i] += ai * b1;
    }
  }
  PSA_UNROLL for (int i = 0; i < MR; ++i) {
    store(c + i * ldc, accumulate ? load(c + i * ldc) + c0[i] : c0[i]);
    store(c + i * ldc + 8, accumulate ? load(c + i * ldc + 8) + c1[i] : c1[i]);
  }
}

constexpr int kRows = 6;

}  // namespace

void gemm_tile(int64_t m, int64_t n, int64_t kdim, const float* a, int64_t a_si, int64_t a_sk,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // Column blocks outside, row blocks inside: one B column block ([kdim][16]) stays in L1
  // while every row block of A streams past it.
  for (int64_t j = 0; j < n; j += kCols) {
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows) {
      micro_tile<kRows>(kdim, a + i * a_si, a_si, a_sk, b + j, ldb, c + i * ldc + j, ldc,
                        accumulate);
    }
    const float* ai = a + i * a_si;
    float* ci = c + i * ldc + j;
    switch (m - i) {
      case 5: micro_tile<5>(kdim, ai, a_si, a_sk, b + j, ldb, ci, ldc, accumulate); break;
      case 4: micro_tile<4>(kdim, ai, a_si, a_sk, b + j, ldb, ci, ldc, accumulate); break;
      case 3: micro_tile<3>(kdim, ai, a_si, a_sk, b + j, ldb, ci, ldc, accumulate); break;
      case 2: micro_tile<2>(kdim, ai, a_si, a_sk, b + j, ldb, ci, ldc, accumulate); break;
      case 1: micro_tile<1>(kdim, ai, a_si, a_sk, b + j, ldb, ci, ldc, accumulate); break;
      default: break;
    }
  }
}

void softmax_update(int64_t nk, int64_t ncols, float* s, float* m, float* l, float* alpha) {
  // Two columns of vectors at a time down the whole tile: the running maximum and sum stay
  // in registers, and the two exp2 chains overlap.
  const vec8 neg_inf = splat(-__builtin_inff());
  for (int64_t c = 0; c < ncols; c += 16) {
    const vec8 m_old0 = load(m + c), m_old1 = load(m + c + 8);
    vec8 mx0 = m_old0, mx1 = m_old1;
    for (int64_t j = 0; j < nk; ++j) {
      mx0 = vmax(mx0, load(s + j * ncols + c));
      mx1 = vmax(mx1, load(s + j * ncols + c + 8));
    }
    // A column whose maximum is still -inf (only -inf scores so far) takes 0 as its
    // reference, so that exp2(-inf - 0) = 0 rather than NaN; its final 0 / 0 = NaN is eager
    // softmax's.
    const vec8 ref0 = mx0 == neg_inf ? vec8{} : mx0, ref1 = mx1 == neg_inf ? vec8{} : mx1;
    vec8 sum0{}, sum1{};
    for (int64_t j = 0; j < nk; ++j) {
      float* row = s + j * ncols + c;
      const vec8 p0 = exp2v(load(row) - ref0), p1 = exp2v(load(row + 8) - ref1);
      store(row, p0);
      store(row + 8, p1);
      sum0 += p0;
      sum1 += p1;
    }
    const vec8 a0 = exp2v(m_old0 - ref0), a1 = exp2v(m_old1 - ref1);
    store(l + c, load(l + c) * a0 + sum0);
    store(l + c + 8, load(l + c + 8) * a1 + sum1);
    store(m + c, mx0);
    store(m + c + 8, mx1);
    store(alpha + c, a0);
    store(alpha + c + 8, a1);
  }
}

void exp2_minus(int64_t nk, int64_t ncols, float* s, const float* lse2) {
  for (int64_t j = 0; j < nk; ++j) {
    float* row = s + j * ncols;
    for (int64_t c = 0; c < ncols; c += 8) store(row + c, exp2v(load(row + c) - load(lse2 + c)));
  }
}

void softmax_grad(int64_t nk, int64_t ncols, const float* p, float* dp, const float* delta) {
  for (int64_t j = 0; j < nk; ++j) {
    const float* prow = p + j * ncols;
    float* drow = dp + j * ncols;
    for (int64_t c = 0; c < ncols; c += 8) {
      store(drow + c, load(prow + c) * (load(drow + c) - load(delta + c)));
    }
  }
}

void scale_columns(int64_t rows, int64_t ncols, float* x, const float* f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ncols;
    for (int64_t c = 0; c < ncols; c += 8) store(row + c, load(row + c) * load(f + c));
  }
}

}  // namespace PSA_TILE_ISA

extern const TileMath PSA_TILE_TABLE = {PSA_TILE_ISA::gemm_tile, PSA_TILE_ISA::softmax_update,
                                        PSA_TILE_ISA::exp2_minus, PSA_TILE_ISA::softmax_grad,
                                        PSA_TILE_ISA::scale_columns};

}  // namespace cpu
}  // namespace psa_fa2
