// The tile math for the baseline instruction set the extension is built for (any CPU).
#define PSA_TILE_ISA baseline
#define PSA_TILE_TABLE kTileMathBaseline
#include "tile_math_impl.h"
