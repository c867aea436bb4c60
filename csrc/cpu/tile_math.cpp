// Picks the copy of the tile math (tile_math_impl.h) that the CPU can run, once.
#include "tile_math.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

namespace psa_fa2 {
namespace cpu {

extern const TileMath kTileMathBaseline;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
extern const TileMath kTileMathAvx2;
extern const TileMath kTileMathAvx512;
#endif

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_avx512f() {
  __builtin_cpu_init();
  return has_avx2_fma() && __builtin_cpu_supports("avx512f");
}
#endif

const TileMath* cpu_choice() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (has_avx512f()) return &kTileMathAvx512;
  return has_avx2_fma() ? &kTileMathAvx2 : &kTileMathBaseline;
#else
  return &kTileMathBaseline;
#endif
}

std::atomic<const TileMath*> forced{nullptr};

}  // namespace

const TileMath& tile_math() {
  static const TileMath* const chosen = cpu_choice();
  const TileMath* f = forced.load(std::memory_order_relaxed);
  return f ? *f : *chosen;
}

void force_tile_math(const char* isa) {
  if (std::strcmp(isa, "auto") == 0) {
    forced.store(nullptr);
  } else if (std::strcmp(isa, "baseline") == 0) {
    forced.store(&kTileMathBaseline);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  } else if (std::strcmp(isa, "avx2") == 0 && has_avx2_fma()) {
    forced.store(&kTileMathAvx2);
  } else if (std::strcmp(isa, "avx512") == 0 && has_avx512f()) {
    forced.store(&kTileMathAvx512);
#endif
  } else {
    throw std::invalid_argument(std::string("isa must be \"auto\", \"baseline\", or one this "
                                            "CPU runs: \"avx2\" (AVX2 and FMA), \"avx512\" "
                                            "(AVX-512F); got \"") + isa + "\"");
  }
}

const char* tile_math_isa() {
  const TileMath* t = &tile_math();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (t == &kTileMathAvx512) return "avx512";
  if (t == &kTileMathAvx2) return "avx2";
#endif
  return "baseline";
}

}  // namespace cpu
}  // namespace psa_fa2
