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

// How the Hopper forward reads K and V: as the rows it is given (possibly aligned copies the
// plan made), or as tile images (a copy the plan made) by CTAs of two or three warpgroups.
enum class KVRead : int { kRows = 0, kTileImages2wg = 1, kTileImages3wg = 2 };
// How the Hopper backward reads Q and dO (and lse, D): rows, or stream images the plan made.
enum class StreamRead : int { kRows = 0, kStreamImages = 1 };

// What a call asks for: the fastest kernel that covers it (falling back to the reference one),
// a fast kernel or an error, or the reference kernel.
enum class Impl : int { kAuto = 0, kFast, kReference };

// Kernel families. Which one runs, on which instance and copies, is decided in plan.cpp only.
enum class FwdKernel : int { kReference = 0, kMmaSync, kFfma, kTf32, kWgmma, kBlockwise };
enum class BwdKernel : int { kReference = 0, kMmaSync, kFfma, kWgmma, kBlockwise };
// The mma.sync backward's schedules:
//   kAtomicDQ:  FlashAttention-2 (key-tile CTAs, dQ reduced with fp32 atomics into the
//               workspace, then converted); not bit-reproducible.
//   kCombined:  row-tile CTAs compute dK / dV and dQ, S recomputed; no atomics, no workspace;
//               bit-reproducible.
enum class BwdSchedule : int { kAtomicDQ = 0, kCombined = 1 };

// One compiled instance (instances/registry.h lists them all). vec_bytes is the global access
// width of the tensors read as rows; read / read_vec_bytes say how the streamed pair is read
// (K / V in the forward, Q / dO in the wgmma backward). The mma.sync and FFMA backward
// instances cover every width (vec_bytes 0): their launchers pick it.
struct FwdInstance {
  FwdKernel kernel;
  DType dtype;
  int dk, dv;
  Layout layout;
  int vec_bytes;
  KVRead read;
  int read_vec_bytes;
  int smem_bytes;  // dynamic shared memory per CTA
};
struct BwdInstance {
  BwdKernel kernel;
  DType dtype;
  int dk, dv;
  Layout layout;
  int vec_bytes;
  StreamRead read;
  int read_vec_bytes;
  int smem_bytes;  // dynamic shared memory per CTA (the larger schedule's, mma.sync)
};

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
