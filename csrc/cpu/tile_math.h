// The fp32 arithmetic of the fused CPU kernels: a small GEMM, exp2 and the column-wise
// online softmax, on vectors of one register (16 floats with AVX-512, 8 with AVX2, else 4).
//
// Both directions work on transposed score tiles, S^T[key][query]: every softmax statistic
// is a per-query (per-column) value, so max, sum and rescale are plain vertical vector ops
// with no horizontal reductions, and channel-first inputs (stride of N == 1) are read in
// place as the rows the vectors load.
//
// The code (tile_math_impl.h) is compiled three times on x86-64: for AVX-512F, for AVX2 +
// FMA and for the baseline the rest of the extension is built for, as torch is, so that it
// still loads on CPUs without AVX2; tile_math() picks one copy for the CPU it runs on, once.
// (at::vec would give an extension the baseline only: torch chooses its AVX2 code at compile
// time, per kernel file, with flags an extension's build does not get.)
#pragma once

#include <cstdint>

namespace psa_fa2 {
namespace cpu {

// Columns of the narrowest micro-tile of every GEMM (AVX-512 also runs tiles of twice as
// many), and the unit that every column count (queries of a tile, padded head dims) is
// rounded up to, so no loop has a tail.
constexpr int64_t kCols = 16;

inline int64_t round_up_cols(int64_t n) { return (n + kCols - 1) / kCols * kCols; }

// The scores are kept in log2 units (exp2 is what the tile math computes).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct TileMath {
  // C[m][0:n] (+)= sum_k A(i, k) B[k][0:n], n a multiple of kCols. A is read one element at a
  // time (a[i * a_si + k * a_sk], any strides: a K or V tile in its own layout); B and C are
  // row-major with row strides ldb and ldc.
  void (*gemm_tile)(int64_t m, int64_t n, int64_t kdim, const float* a, int64_t a_si,
                    int64_t a_sk, const float* b, int64_t ldb, float* c, int64_t ldc,
                    bool accumulate);

  // Online softmax over the keys of a score tile s[nk][ncols] (log2 units), column by column:
  // m_new = max(m, max_j s[j]); s[j] = exp2(s[j] - m_new); l = l * exp2(m - m_new) + sum_j s[j];
  // alpha[c] = exp2(m - m_new), the factor that rescales what was accumulated with m.
  // m, l, alpha: ncols floats each; ncols a multiple of kCols.
  void (*softmax_update)(int64_t nk, int64_t ncols, float* s, float* m, float* l,
                         float* alpha);

  // p[j][c] = exp2(s[j][c] - lse2[c]) in place (lse2: log2 units). ncols a multiple of kCols.
  void (*exp2_minus)(int64_t nk, int64_t ncols, float* s, const float* lse2);

  // ds[j][c] = p[j][c] * (dp[j][c] - delta[c]) in place on dp. ncols a multiple of kCols.
  void (*softmax_grad)(int64_t nk, int64_t ncols, const float* p, float* dp,
                       const float* delta);

  // x[r][c] *= f[c] for r < rows. ncols a multiple of kCols.
  void (*scale_columns)(int64_t rows, int64_t ncols, float* x, const float* f);
};

// The copy for this CPU: AVX-512 where it has AVX-512F, else AVX2 + FMA where it has both,
// else the baseline.
const TileMath& tile_math();

// Its name, for build and run-time reports: "avx512", "avx2" or "baseline".
const char* tile_math_isa();

// Tests only (psa_fa2_ext._testing): run the given copy ("avx512", "avx2" or "baseline") from
// now on, or the CPU's own again ("auto"), so that every copy a CPU can run is tested on it.
void force_tile_math(const char* isa);

}  // namespace cpu
}  // namespace psa_fa2
