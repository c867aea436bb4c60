// The copies of the Hopper kernels' callers (aligned_rows.h): rows of 2-byte elements whose
// starts are narrowly aligned, copied to rows that start at 16-byte multiples (the callers pad
// them to 128; K and V for the forward, Q and dO for the backward) or to the forward's K / V
// tile images (RowCopy in launchers.h). A generic strided tensor copy moves them at well under
// half the memory bandwidth (one element per thread); this kernel loads each thread's 8
// consecutive elements with 2-byte loads (a warp still reads 512 contiguous bytes) and stores
// them as one 16-byte vector.
#include <cstdint>

#include "launchers.h"

namespace psa_fa2 {
namespace {

constexpr int kThreads = 128;
constexpr int kElemsPerThread = 8;
constexpr int64_t kMaxColumnBlocks = 65535;  // grid.y

// Elements col0 .. col0 + 7 of a source row of `cols`, those past its end 0, packed.
__device__ __forceinline__ uint4 load_8(const uint16_t* src_row, int64_t col0, int64_t cols) {
  const uint16_t* src = src_row + col0;
  uint16_t x[kElemsPerThread];
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) x[i] = col0 + i < cols ? __ldg(src + i) : 0;
  uint4 packed;
  packed.x = x[0] | (uint32_t(x[1]) << 16);
  packed.y = x[2] | (uint32_t(x[3]) << 16);
  packed.z = x[4] | (uint32_t(x[5]) << 16);
  packed.w = x[6] | (uint32_t(x[7]) << 16);
  return packed;
}

// Grid: (rows, column blocks up to kMaxColumnBlocks); each CTA strides over its row's columns
// in steps of gridDim.y blocks, so rows of any length fit grid.y's limit. kTiles: tile images
// (c.tile_tokens), whose rows run on to the end of the last tile; else rows.
template <bool kTiles>
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(const RowCopy c) {
  const int64_t row = blockIdx.x;  // (b, h, channel) of the source
  const int64_t bh = row / c.channels, ch = row % c.channels;
  const int64_t b = bh / c.heads, h = bh % c.heads;
  const uint16_t* src_row = static_cast<const uint16_t*>(c.src) + b * c.src_stride_b +
                            h * c.src_stride_h + ch * c.src_stride_c;
  const int64_t dst_row = c.dst_channel0 + ch;
  uint16_t* const dst = static_cast<uint16_t*>(c.dst);
  const int64_t tiles = kTiles ? (c.cols + c.tile_tokens - 1) / c.tile_tokens : 0;
  const int64_t dst_cols = kTiles ? tiles * c.tile_tokens : c.cols;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kThreads * kElemsPerThread;
  for (int64_t col0 = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kElemsPerThread;
       col0 < dst_cols; col0 += step) {
    uint16_t* to;
    if constexpr (kTiles) {
      const int64_t tile = col0 / c.tile_tokens, chunk = col0 % c.tile_tokens / kElemsPerThread;
      to = dst + ((bh * tiles + tile) * c.dst_channels + dst_row) * c.tile_tokens +
           (chunk ^ (dst_row % 8)) * kElemsPerThread;
    } else {
      // dst rows: multiples of 8 elements, 16-byte base.
      to = dst + (bh * c.dst_channels + dst_row) * c.dst_stride_c + col0;
    }
    *reinterpret_cast<uint4*>(to) = load_8(src_row, col0, c.cols);
  }
}

}  // namespace

void copy_rows(const RowCopy& c, cudaStream_t stream) {
  const int64_t rows = c.batch * c.heads * c.channels;
  const int64_t per_block = int64_t(kThreads) * kElemsPerThread;
  if (rows == 0 || c.cols == 0) return;
  const int64_t cols =
      c.tile_tokens ? (c.cols + c.tile_tokens - 1) / c.tile_tokens * c.tile_tokens : c.cols;
  const int64_t column_blocks = (cols + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>(column_blocks < kMaxColumnBlocks ? column_blocks
                                                                         : kMaxColumnBlocks));
  if (c.tile_tokens) {
    copy_rows_kernel<true><<<grid, kThreads, 0, stream>>>(c);
  } else {
    copy_rows_kernel<false><<<grid, kThreads, 0, stream>>>(c);
  }
}

}  // namespace psa_fa2
