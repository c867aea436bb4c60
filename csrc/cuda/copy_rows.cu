// The aligned row copies of the Hopper kernels' callers (aligned_rows.h: K and V for the
// forward, Q and dO for the backward): rows of 2-byte elements whose starts are narrowly
// aligned, copied to rows that start at 16-byte multiples (the callers pad them to 128). A generic
// strided tensor copy moves them at well under half the memory bandwidth (one element per
// thread); this kernel loads each thread's 8 consecutive elements with 2-byte loads (a warp
// still reads 512 contiguous bytes) and stores them as one 16-byte vector.
#include <cstdint>

#include "launchers.h"

namespace psa_fa2 {
namespace {

constexpr int kThreads = 128;
constexpr int kElemsPerThread = 8;
constexpr int64_t kMaxColumnBlocks = 65535;  // grid.y

// Grid: (rows, column blocks up to kMaxColumnBlocks); each CTA strides over its row's columns
// in steps of gridDim.y blocks, so rows of any length fit grid.y's limit.
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(const RowCopy c) {
  const int64_t row = blockIdx.x;  // (b, h, channel) of the source
  const int64_t bh = row / c.channels, ch = row % c.channels;
  const int64_t b = bh / c.heads, h = bh % c.heads;
  const uint16_t* src_row = static_cast<const uint16_t*>(c.src) + b * c.src_stride_b +
                            h * c.src_stride_h + ch * c.src_stride_c;
  uint16_t* dst_row = static_cast<uint16_t*>(c.dst) +
                      (bh * c.dst_channels + c.dst_channel0 + ch) * c.dst_stride_c;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kThreads * kElemsPerThread;
  for (int64_t col0 = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kElemsPerThread;
       col0 < c.cols; col0 += step) {
    const uint16_t* src = src_row + col0;
    uint16_t x[kElemsPerThread];
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) x[i] = col0 + i < c.cols ? __ldg(src + i) : 0;
    uint4 packed;
    packed.x = x[0] | (uint32_t(x[1]) << 16);
    packed.y = x[2] | (uint32_t(x[3]) << 16);
    packed.z = x[4] | (uint32_t(x[5]) << 16);
    packed.w = x[6] | (uint32_t(x[7]) << 16);
    // dst rows: multiples of 8 elements, 16-byte base.
    *reinterpret_cast<uint4*>(dst_row + col0) = packed;
  }
}

}  // namespace

void copy_rows(const RowCopy& c, cudaStream_t stream) {
  const int64_t rows = c.batch * c.heads * c.channels;
  const int64_t per_block = int64_t(kThreads) * kElemsPerThread;
  if (rows == 0 || c.cols == 0) return;
  const int64_t column_blocks = (c.cols + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>(column_blocks < kMaxColumnBlocks ? column_blocks
                                                                         : kMaxColumnBlocks));
  copy_rows_kernel<<<grid, kThreads, 0, stream>>>(c);
}

}  // namespace psa_fa2
