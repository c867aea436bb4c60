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
#endif

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

const TileMath* cpu_choice() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
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
  } else if (std::strcmp(isa, "avx2") == 0 && cpu_choice() != &kTileMathBaseline) {
    forced.store(cpu_choice());
  } else {
    throw std::invalid_argument(std::string("isa must be \"auto\", \"baseline\" or (on a CPU "
                                            "with AVX2 and FMA) \"avx2\", got \"") + isa + "\"");
  }
}

const char* tile_math_isa() { return &tile_math() == &kTileMathBaseline ? "baseline" : "avx2"; }

}  // namespace cpu
}  // namespace psa_fa2
