// Plain parameter structs shared by the host bindings and the CUDA kernels.
// Deliberately free of torch headers: kernels compile against this file alone,
// which keeps each .cu fast to build and lets builds run in parallel.
#pragma once

#include <cstdint>

namespace psa_fa2 {

enum class DType : int { kFloat64 = 0, kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3 };

// Which stride of a logical [B, H, N, D] tensor is 1.
//   kTokenMajor:   stride_d == 1  (e.g. a contiguous [B, H, N, D] tensor)
//   kChannelFirst: stride_n == 1  (e.g. the PSA `split` views of a [B, H, D, N] conv output)
enum class Layout : int { kTokenMajor = 0, kChannelFirst = 1 };

// kKVVecBytes (K / V access width) of the Hopper forward instantiations that read K and V as
// tile images (FwdParams::kv_tile_images) instead of rows: CTAs of two warpgroups on steps of 64
// keys ("cft"), or of three on steps of 128 ("cft3"; flash_fwd_sm90_kernel.cuh).
constexpr int kKVTileImages = 0;
constexpr int kKVTileImages3 = 1;
// kStreamVecBytes of the Hopper backward instantiations that read Q, dO, lse and D as stream
// images (BwdParams::stream_tile_images; stream_tile_images.h) instead of rows.
constexpr int kStreamTileImages = 0;

// The most CTAs that share a row tile of the fp32 forward (FwdParams::kv_splits), and its
// kernels' query rows per CTA and most keys per key tile, which its dispatch plans with.
constexpr int kMaxKvSplits = 8;
constexpr int kF32FwdRowsPerCta = 128;
constexpr int kF32FwdMaxKeysPerTile = 64;

// A logical [B, H, N, D] tensor addressed by 64-bit element strides.
struct Strided4 {
  void* ptr;
  int64_t stride_b, stride_h, stride_n, stride_d;
};

struct FwdParams {
  Strided4 q;    // [B, H, N, dk]
  Strided4 k;    // [B, H, N, dk]
  Strided4 v;    // [B, H, N, dv]
  Strided4 out;  // [B, H, N, dv], written
  void* lse;     // [B, H, N] contiguous; float (double for float64 inputs); natural log
  int batch, heads, seqlen, head_dim_qk, head_dim_v;
  double scale;  // softmax scale applied to Q K^T (natural units)
  DType dtype;   // dtype of q, k, v and out
  Layout layout; // shared by q, k, v and out
  bool allow_tf32;  // fp32 inputs only: TF32 tensor cores allowed (matmul precision != "highest")
  // Fast Hopper forward only: k.ptr holds K and V as 64-key tile images (RowCopy's tiled mode,
  // dk + dv channels per tile), and k's strides and v are not read.
  bool kv_tile_images;
  // fp32 forward only (flash_fwd_f32_kv_splits): kv_splits > 1 CTAs share each row tile,
  // each taking a run of the key tiles; they leave normalized partial outputs and their log2
  // sums in kv_split_scratch (flash_fwd_f32_split_scratch_bytes), which a second kernel
  // combines into out and lse.
  int kv_splits;
  void* kv_split_scratch;
};

struct BwdParams {
  Strided4 q, k, v, out, dout;  // as in FwdParams; dout is [B, H, N, dv]
  Strided4 dq;   // [B, H, N, dk], accumulated into (+=) when accumulate, else overwritten
  Strided4 dk;   // [B, H, N, dk], likewise
  Strided4 dv;   // [B, H, N, dv], overwritten
  const void* lse;  // [B, H, N] contiguous, as written by the forward
  void* delta;      // [B, H, N] contiguous scratch of the lse dtype: rowsum(dout * out)
  void* workspace;  // fast kernels only: scratch of workspace_bytes (see fast_bwd_workspace_bytes)
  int batch, heads, seqlen, head_dim_qk, head_dim_v;
  double scale;
  DType dtype;
  Layout layout;
  bool allow_tf32;
  bool deterministic;  // bit-identical results run to run
  bool accumulate;     // dq += ..., dk += ... (else dq = ..., dk = ...)
  // Fast Hopper backward, channel-first only: when set, Q and dO as stream images
  // (stream_tile_images.h), which the kernel streams instead of q and dout, and whose lse / D
  // rows the preprocess fills in. q, dout and the rest are still read as given elsewhere.
  void* stream_tile_images;
};

}  // namespace psa_fa2
