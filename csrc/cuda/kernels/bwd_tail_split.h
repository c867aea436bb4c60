// The last, partial wave of the Hopper backward, shared out along the query stream.
//
// The wgmma backward runs one CTA per SM (bwd_sm90.cuh) and each CTA owns one key
// tile for the whole query stream, so T equal tiles take ceil(T / SMs) tile times, and a last
// wave of few tiles leaves most SMs idle for a whole tile time.
// When the last wave is at most half full, its tiles are each shared by `pieces` CTAs that take
// consecutive runs of the query steps. Those add their dK / dV registers (fp32, in fragment
// order) to a partial sum in the workspace, and the last of a tile's CTAs to finish writes dk
// and dv from it. Blocks start in the order of their linear index, so the pieces come last.
#pragma once

#include <cstddef>
#include <cstdint>

namespace psa_fa2 {

// With pieces > 1 the CTA of linear index `cta` (blockIdx.x fastest) owns key tile `cta` (a
// head's tiles in a row, heads in turn) when cta < whole, else a run of steps of a later tile;
// with pieces = 1, the grid is (tiles, B * H) and every CTA owns a tile.
struct BwdTailSplit {
  int tiles;       // key tiles per (batch, head)
  int whole;       // CTAs owning a whole tile (pieces > 1)
  int pieces;      // each later tile is shared by this many CTAs (1: no split)
  int ctas;        // whole + (tiles of all heads - whole) * pieces; the grid's others exit
  float* partial;  // per shared tile: the dK / dV sum of its CTAs, in fragment order
  int* arrivals;   // per shared tile: how many of its CTAs have added theirs
};

// Each CTA also loads its K / V rows and runs the epilogue: at least this many steps of 64
// query rows per piece.
constexpr int kBwdMinStepsPerPiece = 2;
constexpr int kBwdMaxPieces = 16;

// `slots`: CTAs resident on the device at once (SMs x CTAs per SM).
inline BwdTailSplit plan_bwd_tail_split(int tiles, int heads_total, int n_steps, int slots) {
  const int64_t all = int64_t(tiles) * heads_total;
  BwdTailSplit s{tiles, 0, 1, 0, nullptr, nullptr};
  if (slots <= 0 || all == 0 || all > (int64_t(1) << 30)) return s;
  const int64_t last = all % slots;  // the partial wave (all of them when fewer than slots)
  if (last == 0 || 2 * last > slots) return s;
  int64_t pieces = slots / last;
  if (pieces > n_steps / kBwdMinStepsPerPiece) pieces = n_steps / kBwdMinStepsPerPiece;
  if (pieces > kBwdMaxPieces) pieces = kBwdMaxPieces;
  const int64_t ctas = all - last + last * pieces;
  // The grid is (tiles, ceil(ctas / tiles)): its y extent must stay a valid grid dimension.
  if (pieces < 2 || (ctas + tiles - 1) / tiles > 65535) return s;
  s.whole = int(all - last);
  s.pieces = int(pieces);
  s.ctas = int(ctas);
  return s;
}

// The Hopper backward's CTAs: 128 keys each, 64 query rows per step, one CTA per SM (about 240
// registers for 256 threads).
constexpr int kSm90BwdKeysPerCta = 128;
constexpr int kSm90BwdRowsPerStep = 64;
constexpr int kSm90BwdCtasPerSm = 1;

// plan_bwd computes it once: it sizes the workspace and the launcher runs it.
inline BwdTailSplit plan_sm90_bwd_tail_split(int n, int heads_total, int multiprocessors) {
  return plan_bwd_tail_split((n + kSm90BwdKeysPerCta - 1) / kSm90BwdKeysPerCta, heads_total,
                             (n + kSm90BwdRowsPerStep - 1) / kSm90BwdRowsPerStep,
                             multiprocessors * kSm90BwdCtasPerSm);
}

inline int bwd_tail_split_tiles(const BwdTailSplit& s) {
  return s.pieces > 1 ? (s.ctas - s.whole) / s.pieces : 0;
}

// Workspace bytes of the partial sums (tile_floats each) and arrival counters, a multiple of 16.
inline size_t bwd_tail_split_bytes(const BwdTailSplit& s, int tile_floats) {
  const size_t shared_tiles = size_t(bwd_tail_split_tiles(s));
  return shared_tiles * tile_floats * sizeof(float) + (shared_tiles * sizeof(int) + 15) / 16 * 16;
}

}  // namespace psa_fa2
