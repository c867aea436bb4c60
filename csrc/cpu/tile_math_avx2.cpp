// The tile math for x86-64 CPUs with AVX2 and FMA. The pragma compiles this whole file for
// them; tile_math() calls into it only on such a CPU.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif
#define PSA_TILE_ISA avx2
#define PSA_TILE_TABLE kTileMathAvx2
#define PSA_TILE_LANES 8
#include "tile_math_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
