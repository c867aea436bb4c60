// The tile math for x86-64 CPUs with AVX-512F (its FMAs included). The pragma compiles this
// whole file for them; tile_math() calls into it only on such a CPU. 16-float vectors and 32
// registers: GEMM micro-tiles of 12 rows by two vectors (tile_math_impl.h).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma")
#endif
#define PSA_TILE_ISA avx512
#define PSA_TILE_TABLE kTileMathAvx512
#define PSA_TILE_LANES 16
#define PSA_TILE_REGISTERS 32
#include "tile_math_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
