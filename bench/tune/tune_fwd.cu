// NOTE: builds against the tree of commit 28fac21 only (`git checkout 28fac21`, or a worktree
// of it): the last with the compile-time variants (the PSA_FA2_* macros) and the old csrc/cuda
// file layout it includes. The current tree has neither; this is not ported to it
// (bench/tune/README.md lists what runs there).
// Times compile-time variants of the fast forward kernels (tile sizes, CTAs per SM) at the
// PSA shapes, without torch: build one binary per variant (tune_fwd.sh) and compare.
//   tune_fwd bf16   the bf16 tensor-core kernel (flash_fwd_kernel.cuh)
//   tune_fwd sm90   the bf16 wgmma kernel (flash_fwd_sm90_kernel.cuh; build for sm_90a)
//   tune_fwd sm90img  the same on K / V tile images (copied once, outside the timing; link
//                   csrc/cuda/copy_rows.cu), CTAs of two warpgroups ("cft")
//   tune_fwd sm90img3 the same, CTAs of three warpgroups on steps of 128 keys ("cft3")
//   tune_fwd tf32   the fp32 TF32 kernel (flash_fwd_tf32_kernel.cuh)
// Prints "shape us TFLOP/s checksum"; the checksum of out must agree across variants. The 16-bit
// kinds run bf16, or fp16 in a build with -DPSA_FA2_TUNE_FP16.
// Shapes may follow the kind (bf16 / sm90 / sm90img), e.g. `tune_fwd sm90img 1x2x62500`.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../../csrc/cuda/flash_fwd_kernel.cuh"
#include "../../csrc/cuda/flash_fwd_sm90_kernel.cuh"
#include "../../csrc/cuda/flash_fwd_tf32_kernel.cuh"
#include "../../csrc/cuda/launchers.h"
#include "tune_common.cuh"

using namespace psa_fa2;

#if defined(PSA_FA2_TUNE_FP16)
using Half = __half;
constexpr DType kHalf = DType::kFloat16;
#else
using Half = __nv_bfloat16;
constexpr DType kHalf = DType::kBFloat16;
#endif

bool g_sm90 = false;
int g_images = -1;  // the K / V width code of the image kernel, or -1: rows

// (32, 64) channel-first, the PSA views, through the launcher the extension dispatches to.
template <class T, int kVec>
void launch(const FwdParams& p) {
  if constexpr (sizeof(T) == 2) {
    if (g_images == kKVTileImages) {
      launch_flash_fwd_sm90<kHalf, 32, 64, Layout::kChannelFirst, kVec, kKVTileImages>(
          p, 0);
    } else if (g_images == kKVTileImages3) {
      launch_flash_fwd_sm90<kHalf, 32, 64, Layout::kChannelFirst, kVec, kKVTileImages3>(
          p, 0);
    } else if (g_sm90) {
      launch_flash_fwd_sm90<kHalf, 32, 64, Layout::kChannelFirst, kVec, kVec>(p, 0);
    } else {
      launch_flash_fwd<kHalf, 32, 64, Layout::kChannelFirst, kVec>(p, 0);
    }
  } else {
    launch_flash_fwd_f32<32, 64, Layout::kChannelFirst, kVec, true>(p, 0);
  }
}

template <class T, int kVec>
void run(int B, int H, int N) {
  const int dk = 32, dv = 64, C = 2 * dk + dv;
  const size_t n_qkv = size_t(B) * H * C * N, n_out = size_t(B) * H * dv * N;
  T *qkv, *out;
  float* lse;
  CHECK(cudaMalloc(&qkv, n_qkv * sizeof(T)));
  CHECK(cudaMalloc(&out, n_out * sizeof(T)));
  CHECK(cudaMalloc(&lse, size_t(B) * H * N * 4));
  tune::fill<<<1024, 256>>>(qkv, n_qkv);
  FwdParams p{};
  auto view = [&](T* base, int64_t off, int64_t sh) { return Strided4{base + off, sh * H, sh, 1, N}; };
  p.q = view(qkv, 0, int64_t(C) * N);
  p.k = view(qkv, int64_t(dk) * N, int64_t(C) * N);
  p.v = view(qkv, int64_t(2 * dk) * N, int64_t(C) * N);
  p.out = view(out, 0, int64_t(dv) * N);
  p.lse = lse;
  p.batch = B; p.heads = H; p.seqlen = N; p.head_dim_qk = dk; p.head_dim_v = dv;
  p.scale = 1.0 / 5.656854249492381;
  p.dtype = sizeof(T) == 2 ? kHalf : DType::kFloat32;
  p.layout = Layout::kChannelFirst;
  p.allow_tf32 = true;
  void* images = nullptr;
  if (g_images >= 0) {
    // kv_tile_images_copy (aligned_rows.h) of the split views: K's and V's channels in one copy.
    const int64_t tiles = (N + 63) / 64;
    CHECK(cudaMalloc(&images, size_t(B) * H * tiles * (dk + dv) * 64 * sizeof(T)));
    RowCopy c{p.k.ptr, p.k.stride_b, p.k.stride_h, p.k.stride_d, images, 0, dk + dv, 0,
              B, H, dk + dv, N};
    c.tile_tokens = 64;
    copy_rows(c, 0);
    p.k.ptr = images;
    p.kv_tile_images = true;
  }
  const double us = tune::time_us([&] { launch<T, kVec>(p); }, 20);
  const double sum = tune::checksum(out, n_out);
  const double flops = 2.0 * B * H * double(N) * N * (dk + dv);
  std::printf("%dx%dx%d vec%d %10.1f us %7.1f TFLOP/s checksum %.6e\n", B, H, N, kVec, us, flops / us * 1e-6, sum);
  cudaFree(qkv); cudaFree(out); cudaFree(lse); cudaFree(images);
}

// The access width the dispatch picks at each shape: 16 bytes, 8 for bf16 at N = 62500.
template <class T>
void run_shapes() {
  run<T, 16>(16, 4, 400);
  run<T, 16>(64, 4, 400);
  run<T, 16>(16, 4, 1600);
  run<T, 16>(8, 4, 6400);
  run<T, sizeof(T) == 2 ? 8 : 16>(1, 2, 62500);
}

// Shapes "BxHxN" from the command line, each at the width of its split views' rows (N
// elements apart): 16 bytes where N % 8 == 0, else 8, 4 or 2.
void run_given_shapes(int count, char** shapes) {
  for (int i = 0; i < count; ++i) {
    int B = 0, H = 0, N = 0;
    if (std::sscanf(shapes[i], "%dx%dx%d", &B, &H, &N) != 3 || B < 1 || H < 1 || N < 1) {
      std::fprintf(stderr, "bad shape %s (want BxHxN)\n", shapes[i]);
      std::exit(2);
    }
    if (N % 8 == 0) {
      run<Half, 16>(B, H, N);
    } else if (N % 4 == 0) {
      run<Half, 8>(B, H, N);
    } else if (N % 2 == 0) {
      run<Half, 4>(B, H, N);
    } else {
      run<Half, 2>(B, H, N);
    }
  }
}

int main(int argc, char** argv) {
  const bool tf32 = argc > 1 && std::strcmp(argv[1], "tf32") == 0;
  if (argc > 1 && std::strcmp(argv[1], "sm90img") == 0) g_images = kKVTileImages;
  if (argc > 1 && std::strcmp(argv[1], "sm90img3") == 0) g_images = kKVTileImages3;
  g_sm90 = g_images >= 0 || (argc > 1 && std::strcmp(argv[1], "sm90") == 0);
  if (argc > 1 && !tf32 && !g_sm90 && std::strcmp(argv[1], "bf16") != 0) {
    std::fprintf(stderr, "usage: %s [bf16|sm90|sm90img|sm90img3|tf32] [BxHxN ...]\n", argv[0]);
    return 2;
  }
  if (argc > 2 && !tf32) {
    run_given_shapes(argc - 2, argv + 2);
  } else {
    tf32 ? run_shapes<float>() : run_shapes<Half>();
  }
  return 0;
}
