// The tile math for the baseline instruction set the extension is built for (any CPU), on
// 16-byte vectors, one register of SSE2 (x86-64) and of NEON (aarch64).
#define PSA_TILE_ISA baseline
#define PSA_TILE_TABLE kTileMathBaseline
#define PSA_TILE_LANES 4
#include "tile_math_impl.h"
