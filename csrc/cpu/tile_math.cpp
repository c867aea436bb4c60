// Picks the copy of the tile math (tile_math_impl.h) that the CPU can run, once.
#include "tile_math.h"

namespace psa_fa2 {
namespace cpu {

extern const TileMath kTileMathBaseline;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
extern const TileMath kTileMathAvx2;
#endif

namespace {

bool has_avx2_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

const TileMath& tile_math() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const TileMath& chosen = has_avx2_fma() ? kTileMathAvx2 : kTileMathBaseline;
#else
  static const TileMath& chosen = kTileMathBaseline;
#endif
  return chosen;
}

const char* tile_math_isa() { return &tile_math() == &kTileMathBaseline ? "baseline" : "avx2"; }

}  // namespace cpu
}  // namespace psa_fa2
