// The kernels' host entry points: templates instantiated by the generated units in instances/
// (generate_instances.py), and the tables that map registry.h's instances to them.
#pragma once

#include <cuda_runtime.h>

#include "../attention_params.h"
#include "../plan.h"

namespace psa_fa2 {

// Forward: every launcher runs one call on params (out and lse written).
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes>
void launch_fwd_sm80(const FwdParams& params, cudaStream_t stream);  // fwd_sm80.cuh
template <int kDk, int kDv, Layout kLayout, int kVecBytes, bool kTf32>
void launch_fwd_f32(const FwdParams& params, cudaStream_t stream);  // fwd_f32_*.cuh
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, KVRead kKVRead,
          int kKVVecBytes>
void launch_fwd_sm90(const FwdParams& params, cudaStream_t stream);  // fwd_sm90.cuh

// Backward: params.delta and params.workspace (plan.workspace_bytes) are scratch the caller
// allocated; dq and dk are zeroed by the caller where the kernel only adds to them.
template <DType kDtype, int kDk, int kDv, Layout kLayout>
void launch_bwd_sm80(const BwdParams& params, const BwdPlan& plan, cudaStream_t stream);
template <int kDk, int kDv, Layout kLayout>
void launch_bwd_f32(const BwdParams& params, const BwdPlan& plan, cudaStream_t stream);
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, StreamRead kStreamRead,
          int kStreamVecBytes>
void launch_bwd_sm90(const BwdParams& params, const BwdPlan& plan, cudaStream_t stream);

// The reference kernels (one CTA per query row), any head dims <= 256, T the element type.
template <typename T>
void launch_reference_fwd(const FwdParams& params, cudaStream_t stream);
template <typename T>
void launch_reference_bwd(const BwdParams& params, cudaStream_t stream);
void reference_fwd(const FwdParams& params, cudaStream_t stream);  // by params.dtype
void reference_bwd(const BwdParams& params, cudaStream_t stream);

using FwdLauncher = void (*)(const FwdParams&, cudaStream_t);
using BwdLauncher = void (*)(const BwdParams&, const BwdPlan&, cudaStream_t);
// kFwdLaunchers[i] runs kFwdInstances[i] (instances/launch_table.cu).
extern const FwdLauncher kFwdLaunchers[];
extern const BwdLauncher kBwdLaunchers[];

// Rows of cols 2-byte elements, (b, h, channel) at src + b * src_stride_b + h * src_stride_h +
// channel * src_stride_c, copied into dst, whose row dst_channel0 + channel of head
// bh = b * heads + h it becomes:
//   tile_tokens == 0: rows starting at 16-byte multiples, at dst + (bh * dst_channels + row) *
//     dst_stride_c (dst 16-byte aligned, dst_stride_c a multiple of 8); the elements from cols
//     to the next multiple of 8 become 0;
//   tile_tokens == 64: tile images (fwd_sm90.cuh): token n lands in tile n / 64 of the head, at
//     dst + ((bh * tiles + n / 64) * dst_channels + row) * 64, its 16-byte chunk (n % 64) / 8
//     swizzled to chunk ((n % 64) / 8) ^ (row % 8), as the kernel's shared tiles hold it;
//     tiles = ceil(cols / 64), and the last tile's tokens past cols are 0.
struct RowCopy {
  const void* src;
  int64_t src_stride_b, src_stride_h, src_stride_c;
  void* dst;
  int64_t dst_stride_c, dst_channels, dst_channel0;
  int64_t batch, heads, channels, cols;
  int64_t tile_tokens = 0;
};
void copy_rows(const RowCopy& copy, cudaStream_t stream);  // copy_rows.cu

}  // namespace psa_fa2
