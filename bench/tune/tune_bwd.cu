// NOTE: builds against the tree of commit 28fac21 only (`git checkout 28fac21`, or a worktree
// of it): the last with the compile-time variants (the PSA_FA2_* macros) and the old csrc/cuda
// file layout it includes. The current tree has neither; this is not ported to it
// (bench/tune/README.md lists what runs there).
// Times compile-time variants of the Hopper (wgmma) backward at the PSA shapes, without torch:
// build one binary per variant (the command below, with its -D flags) and compare. bf16,
// (32, 64), channel-first split views on 16-byte rows (N a multiple of 8, as the dispatch's
// aligned copies give at other N).
// Prints "shape us TFLOP/s checksum"; the checksum of the gradients must agree across variants
// up to their rounding (the dQ reductions are not ordered).
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a [-D...] tune_bwd.cu \
//     ../../csrc/cuda/sm90_device.cu ../../csrc/cuda/copy_rows.cu -o tune_bwd
// -DTUNE_STREAM_IMAGES times the kernel on stream images of Q and dO, their copies included.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "../../csrc/cuda/flash_bwd_sm90_kernel.cuh"
#include "../../csrc/cuda/flash_fwd_sm90_kernel.cuh"
#include "../../csrc/cuda/launchers.h"
#include "../../csrc/cuda/stream_tile_images.h"
#include "tune_common.cuh"

using namespace psa_fa2;

// The instantiation the dispatch runs on these inputs (declared extern in its header).
template void psa_fa2::flash_bwd_sm90_instance<DType::kBFloat16, 32, 64, Layout::kChannelFirst,
                                               16, 16>(const BwdParams&, cudaStream_t);
template void psa_fa2::flash_bwd_sm90_instance<DType::kBFloat16, 32, 64, Layout::kChannelFirst,
                                               16, kStreamTileImages>(const BwdParams&,
                                                                      cudaStream_t);

void run(int B, int H, int N) {
  constexpr int dk = 32, dv = 64, C = 2 * dk + dv;
  const size_t n_qkv = size_t(B) * H * C * N, n_out = size_t(B) * H * dv * N;
  const int bh = B * H;
  __nv_bfloat16 *qkv, *out, *dout, *grads;
  float *lse, *delta, *ws;
  CHECK(cudaMalloc(&qkv, n_qkv * 2));
  CHECK(cudaMalloc(&grads, n_qkv * 2));
  CHECK(cudaMalloc(&out, n_out * 2));
  CHECK(cudaMalloc(&dout, n_out * 2));
  CHECK(cudaMalloc(&lse, size_t(bh) * N * 4));
  CHECK(cudaMalloc(&delta, size_t(bh) * N * 4));
  tune::fill<<<1024, 256>>>(qkv, n_qkv, 1u);
  tune::fill<<<1024, 256>>>(dout, n_out, 2u);
  auto view = [&](__nv_bfloat16* base, int64_t off, int64_t sh) {
    return Strided4{base + off, sh * H, sh, 1, N};
  };
  FwdParams f{};
  f.q = view(qkv, 0, int64_t(C) * N);
  f.k = view(qkv, int64_t(dk) * N, int64_t(C) * N);
  f.v = view(qkv, int64_t(2 * dk) * N, int64_t(C) * N);
  f.out = view(out, 0, int64_t(dv) * N);
  f.lse = lse;
  f.batch = B;
  f.heads = H;
  f.seqlen = N;
  f.head_dim_qk = dk;
  f.head_dim_v = dv;
  f.scale = 1.0 / 5.656854249492381;
  f.dtype = DType::kBFloat16;
  f.layout = Layout::kChannelFirst;
  launch_flash_fwd_sm90<DType::kBFloat16, dk, dv, Layout::kChannelFirst, 16, 16>(f, 0);

  BwdParams p{};
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.out = f.out;
  p.dout = view(dout, 0, int64_t(dv) * N);
  p.dq = view(grads, 0, int64_t(C) * N);
  p.dk = view(grads, int64_t(dk) * N, int64_t(C) * N);
  p.dv = view(grads, int64_t(2 * dk) * N, int64_t(C) * N);
  p.lse = lse;
  p.delta = delta;
  p.batch = B;
  p.heads = H;
  p.seqlen = N;
  p.head_dim_qk = dk;
  p.head_dim_v = dv;
  p.scale = f.scale;
  p.dtype = DType::kBFloat16;
  p.layout = Layout::kChannelFirst;
  p.accumulate = false;
  using Cfg = fbwd::Config<DType::kBFloat16, dk, dv, Layout::kChannelFirst>;
  const BwdTailSplit split =
      plan_sm90_bwd_tail_split(N, bh, current_device_multiprocessors());
  // What flash_bwd_workspace_bytes_with (flash_bwd_dispatch.cu) sizes for this kernel.
  const size_t ws_bytes = fbwd::workspace_bytes<Cfg>(p, BwdSchedule::kAtomicDQ) +
                          bwd_tail_split_bytes(split, kSm90BwdKeysPerCta * (dk + dv));
  CHECK(cudaMalloc(&ws, ws_bytes));
  p.workspace = ws;
#if defined(TUNE_STREAM_IMAGES)
  // Q and dO as stream images (stream_tile_images.h), copied in every timed call as the caller
  // does (attention_cuda.cpp).
  void* images;
  CHECK(cudaMalloc(&images, size_t(bh) * stream_image_steps(N) * stream_image_step_bytes(dk, dv)));
  p.stream_tile_images = images;
  auto copy_to_images = [&](const Strided4& src, int channels, int channel0) {
    RowCopy c{src.ptr, src.stride_b, src.stride_h, src.stride_d, images, 0,
              stream_image_channels(dk, dv), channel0, B, H, channels, N};
    c.tile_tokens = kStreamImageTokens;
    copy_rows(c, 0);
  };
  auto launch = [&] {
    copy_to_images(p.q, dk, 0);
    copy_to_images(p.dout, dv, dk);
    flash_bwd_sm90_instance<DType::kBFloat16, dk, dv, Layout::kChannelFirst, 16,
                            kStreamTileImages>(p, 0);
  };
#else
  auto launch = [&] {
    flash_bwd_sm90_instance<DType::kBFloat16, dk, dv, Layout::kChannelFirst, 16, 16>(p, 0);
  };
#endif
  const double us = tune::time_us(launch, N > 20000 ? 10 : 20);
  const double sum = tune::checksum(grads, n_qkv);
  const double flops = 2.0 * bh * double(N) * N * (3 * dk + 2 * dv);  // S, dP, dV, dK, dQ
  std::printf("%dx%dx%d %10.1f us %7.1f TFLOP/s checksum %.6e\n", B, H, N, us,
              flops / us * 1e-6, sum);
  cudaFree(qkv);
  cudaFree(grads);
  cudaFree(out);
  cudaFree(dout);
  cudaFree(lse);
  cudaFree(delta);
  cudaFree(ws);
#if defined(TUNE_STREAM_IMAGES)
  cudaFree(images);
#endif
}

int main() {
  run(16, 4, 400);
  run(16, 4, 1600);
  run(8, 4, 6400);
  run(1, 2, 62464);
  return 0;
}
