// Entry points of the CUDA kernels, called from attention_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention_params.h"

namespace psa_fa2 {

// Reference kernels (the seed's design): grid (N, BH, 1), one CTA per query row.
// Any N, any head dims <= 256, every dtype.
void reference_fwd(const FwdParams& params, cudaStream_t stream);
void reference_bwd(const BwdParams& params, cudaStream_t stream);

// Fast tensor-core forward (FlashAttention-2 tiling). Returns false, launching
// nothing, when no fast instantiation covers params (dtype, head dims, layout).
bool flash_fwd_supported(const FwdParams& params);
void flash_fwd(const FwdParams& params, cudaStream_t stream);
// Whether flash_fwd would run a faster kernel on params with K and V copied to rows that
// start at 128-byte multiples (channel-first, long sequences whose rows do not; aligned_rows.h).
bool flash_fwd_wants_aligned_kv(const FwdParams& params);
// Whether flash_fwd should run on K and V copied to tile images (RowCopy's tiled mode;
// kv_tile_images_copy in aligned_rows.h): then the caller passes params with kv_tile_images
// set and k.ptr the images.
bool flash_fwd_wants_kv_tile_images(const FwdParams& params);

// Rows of cols 2-byte elements, (b, h, channel) at src + b * src_stride_b + h * src_stride_h +
// channel * src_stride_c, copied into dst, whose row dst_channel0 + channel of head
// bh = b * heads + h it becomes:
//   tile_tokens == 0: rows starting at 16-byte multiples, at dst + (bh * dst_channels + row) *
//     dst_stride_c (dst 16-byte aligned, dst_stride_c a multiple of 8); the elements from cols
//     to the next multiple of 8 become 0;
//   tile_tokens == 64: tile images (flash_fwd_sm90_kernel.cuh): token n lands in tile
//     n / 64 of the head, at dst + ((bh * tiles + n / 64) * dst_channels + row) * 64, its
//     16-byte chunk (n % 64) / 8 swizzled to chunk ((n % 64) / 8) ^ (row % 8), as the kernel's
//     shared tiles hold it; tiles = ceil(cols / 64), and the last tile's tokens past cols are 0.
struct RowCopy {
  const void* src;
  int64_t src_stride_b, src_stride_h, src_stride_c;
  void* dst;
  int64_t dst_stride_c, dst_channels, dst_channel0;
  int64_t batch, heads, channels, cols;
  int64_t tile_tokens = 0;
};
void copy_rows(const RowCopy& copy, cudaStream_t stream);

// Fast float32 forward (FlashAttention-2 tiling on FFMA, exact fp32 arithmetic); the same
// contract as flash_fwd_supported / flash_fwd.
bool flash_fwd_f32_supported(const FwdParams& params);
void flash_fwd_f32(const FwdParams& params, cudaStream_t stream);
// How many CTAs share each row tile of the fp32 forward (FwdParams::kv_splits; 1: none),
// and the scratch they need.
int flash_fwd_f32_kv_splits(const FwdParams& params);
size_t flash_fwd_f32_split_scratch_bytes(const FwdParams& params, int kv_splits);

// Fast float32 backward (FlashAttention-2 schedule (a) on FFMA, exact fp32 arithmetic, dQ by
// atomics: not bit-reproducible); it fills params.delta ([B, H, N] float scratch) itself, and
// expects dq and dk zeroed unless accumulating, and dv zeroed where
// flash_bwd_f32_row_pieces(params) > 1 (CTAs sharing a key tile add their dK / dV).
bool flash_bwd_f32_supported(const BwdParams& params);
int flash_bwd_f32_row_pieces(const BwdParams& params);
void flash_bwd_f32(const BwdParams& params, int pieces, cudaStream_t stream);

// Fast tensor-core backward. flash_bwd_workspace_bytes tells how much scratch
// (params.workspace) flash_bwd needs; the caller allocates it uninitialised, as it does
// params.delta ([B, H, N] float, 4-byte aligned), which flash_bwd_supported does not look at.
bool flash_bwd_supported(const BwdParams& params);
size_t flash_bwd_workspace_bytes(const BwdParams& params);
void flash_bwd(const BwdParams& params, cudaStream_t stream);
// Whether the caller should copy q and dout to 128-byte aligned rows (aligned_rows.h) and pass
// those: the Hopper kernel streams them, and their rows are narrow or misaligned.
bool flash_bwd_wants_aligned_stream(const BwdParams& params);
// Whether the caller should copy Q and dO to the wgmma backward's stream images
// (stream_tile_images_copy in aligned_rows.h) and pass them in params.stream_tile_images; the
// preprocess fills in their lse and D. Checked before flash_bwd_wants_aligned_stream.
bool flash_bwd_wants_stream_tile_images(const BwdParams& params);

}  // namespace psa_fa2
