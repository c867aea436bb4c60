// Dispatch of the fast tensor-core forward: picks the instantiation for (dtype, dk, dv, layout,
// global access width) and checks the assumptions of flash_fwd_kernel.cuh. Anything not covered returns
// false from flash_fwd_supported, and the caller falls back to reference_fwd.
//
// On Hopper (compute capability 9.0) the wgmma kernel (flash_fwd_sm90_kernel.cuh) runs where it
// has an instantiation and sm90_kernels_enabled() (sm90_device.h: an sm_90a build, and
// PSA_FA2_DISABLE_SM90 not 1); the mma.sync kernel everywhere else. Both compute
// the same math in fp32 on the same bf16 / fp16 probabilities; only the tensor-core summation
// order differs.
#include "flash_fwd_instances.h"
#include "flash_fwd_sm90_instances.h"
#include "fwd_dispatch_common.h"
#include "launchers.h"
#include "sm90_device.h"

namespace psa_fa2 {
namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

// Channel-first K / V rows start at multiples of N elements; at N % 8 != 0 that limits the
// wgmma kernel's copies of K and V (every CTA streams all of them) to 8, 4 or 2 bytes, and at
// N % 64 != 0 their 64-key tiles straddle 128-byte lines. From these many tokens on (per K / V
// row width; 16: rows that are 16-byte aligned but not 128), the caller copies K and V to
// 128-byte aligned rows first (flash_fwd_wants_aligned_kv, aligned_rows.h). Measured on the H200
// (bench/tune/row_stride.py, bf16, split views, copies included;
// bench/results/h200-2026-12-01-44d4e11/aligned_rows_ab.md), gain with the copies:
//   2-byte rows (odd N):    1.39x at 401, 2.08x at 1601, 2.55x at 6401, 2.20x at 62499;
//   4-byte (N % 4 == 2):    0.83x at 402, 1.04x at 1602, 1.23x at 6402;
//   8-byte (N % 8 == 4):    0.72x at 404, 0.94x at 1604, 1.07x at 6404, 1.10x at 62500;
//   16-byte, not 128:       0.71x at 400, 1.02x at 1608, 1.17x at 6408, 1.15x at 62504.
// PSA_FA2_ALIGNED_KV_MIN_SEQLEN overrides all four (experiments, bench/tune/tune_sm90.sh fwd);
// PSA_FA2_DISABLE_ALIGNED_COPIES=1 turns the copies off at run time (sm90_device.h).
#if defined(PSA_FA2_ALIGNED_KV_MIN_SEQLEN)
constexpr int64_t kAlignedKVMinSeqlen[4] = {
    PSA_FA2_ALIGNED_KV_MIN_SEQLEN, PSA_FA2_ALIGNED_KV_MIN_SEQLEN, PSA_FA2_ALIGNED_KV_MIN_SEQLEN,
    PSA_FA2_ALIGNED_KV_MIN_SEQLEN};
#else
constexpr int64_t kAlignedKVMinSeqlen[4] = {400, 1600, 6400, 1600};  // 2, 4, 8, 16-byte rows
#endif

// X(...) of the instances headers: the launcher of one instantiation, if it matches.
#define PSA_FA2_MATCH(dt, dk, dv, lay, vec)                                         \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && vec_bytes == vec)                                  \
    return &launch_flash_fwd<DType::dt, dk, dv, Layout::lay, vec>;

Launcher find_launcher(const FwdParams& p, int vec_bytes) {
  PSA_FA2_FLASH_FWD_INSTANCES(PSA_FA2_MATCH)
  return nullptr;
}

#undef PSA_FA2_MATCH

#define PSA_FA2_MATCH(dt, dk, dv, lay, vec, kv_vec)                                 \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && vec_bytes == vec && kv_bytes == kv_vec)            \
    return &launch_flash_fwd_sm90<DType::dt, dk, dv, Layout::lay, vec, kv_vec>;

Launcher find_sm90_launcher(const FwdParams& p, int vec_bytes, int kv_bytes) {
  PSA_FA2_FLASH_FWD_SM90_INSTANCES(PSA_FA2_MATCH)
  return nullptr;
}

#undef PSA_FA2_MATCH

// The widest access widths (16, 8, 4 or 2 bytes: 8, 4, 2 or 1 elements) that Q and out, and
// K and V, allow.
struct Widths {
  int q_out, kv;
  int common() const { return q_out < kv ? q_out : kv; }
};

Widths widths(const FwdParams& p) {
  auto width = [&p](const Strided4& s, int head_dim) {
    return fwd_dispatch::vec_bytes(s, p, head_dim, 2, {16, 8, 4, 2});
  };
  const int q = width(p.q, p.head_dim_qk), o = width(p.out, p.head_dim_v);
  const int k = width(p.k, p.head_dim_qk), v = width(p.v, p.head_dim_v);
  return {q < o ? q : o, k < v ? k : v};
}

// Which kernel reads the tile images: CTAs of two warpgroups (128 rows, two CTAs per SM, steps
// of 64 keys; kKVTileImages) or of three (192 rows, one per SM, steps of 128; kKVTileImages3).
// What decides is mostly how the CTAs fall on the SMs: the kernel whose busiest SM has fewer
// rows to work through, counting full waves (132 or 264 CTAs) and then the rest spread over
// the SMs, ceil(rest / SMs) on the busiest one; the three-warpgroup rows count 0.93 of the
// others', since an SM gets through them about 7% faster (on long rows, kernels alone: 1.06x
// at 1,1,100000, where both leave 768 rows, 1.04x at 2,2,31250, 1.06x at 1,4,40000 against
// their counts). Measured on the H200 (bf16, the kernels alone, bench/tune/tune_fwd.cu
// sm90img / sm90img3; bench/results/h200-2026-12-02-cd6e976/kernel_ab_waves.txt), three
// warpgroups against two, it picks the faster kernel at 16 of 19 shapes from 12800 to 100000
// tokens: three at 1.25-1.34x at 1,1,20000-24999, 1.22x at 1,2,20000, 1.07x at 2,4,15625,
// 1.12x at 1,2,62500, 1.05x at 2,4,12800 and 4,4,12800; two at 1.42-1.51x at 1,2,12800-15625,
// 1.04-1.13x at 1,{4,8},15625-20000 and 2,2,16000. It misses by 2-3% at 1,1,12800-16000
// (two warpgroups' 100-125 CTAs, one per SM, leave each SM 128 rows against 192, yet run no
// faster) and by 0.1% at 4,2,20000. (Counting whole waves of two CTAs per SM, from 25000
// tokens on only, as before, missed 1.07-1.34x at 15625-24999 tokens.)
int kv_image_kernel(const FwdParams& p) {
  const int forced = kv_tile_images_choice().warpgroups;
  if (forced == 2 || forced == 3) return forced == 3 ? kKVTileImages3 : kKVTileImages;
  const int64_t sms = current_device_multiprocessors();
  if (sms <= 0) return kKVTileImages;
  const int64_t heads = int64_t(p.batch) * p.heads;
  // Rows on the busiest SM: ceil(N / rows) * heads CTAs, `per_sm` resident on each SM.
  auto rows_per_sm = [&](int64_t rows, int64_t per_sm) {
    const int64_t ctas = (p.seqlen + rows - 1) / rows * heads;
    const int64_t full_waves = ctas / (per_sm * sms);
    const int64_t rest = ctas - full_waves * per_sm * sms;
    return (full_waves * per_sm + (rest + sms - 1) / sms) * rows;
  };
  return rows_per_sm(192, 1) * 93 <= rows_per_sm(128, 2) * 100 ? kKVTileImages3 : kKVTileImages;
}

Launcher select(const FwdParams& p) {
  if (!fwd_dispatch::params_ok(p)) return nullptr;
  const Widths w = widths(p);
  // K and V as tile images: only the wgmma kernel reads them.
  if (p.kv_tile_images) {
    return sm90_kernels_enabled() && p.layout == Layout::kChannelFirst && w.q_out >= 2
               ? find_sm90_launcher(p, w.q_out, kv_image_kernel(p))
               : nullptr;
  }
  const int vec = w.common();
  // Token-major instantiations exist for 16-byte rows only; channel-first for every width >= 2
  // (16: "cf"; 8, 4 and 2: "cfu"; on Hopper also "cfs", see generate_flash_fwd.py).
  if (!(vec == 16 || (p.layout == Layout::kChannelFirst && vec >= 2))) return nullptr;
  if (sm90_kernels_enabled()) {
    // K and V on 16-byte rows, Q or out not: "cfs".
    if (w.kv == 16 && w.q_out < 16) {
      if (Launcher launch = find_sm90_launcher(p, w.q_out, 16)) return launch;
    }
    if (Launcher launch = find_sm90_launcher(p, vec, vec)) return launch;
  }
  return find_launcher(p, vec);
}

}  // namespace

bool flash_fwd_supported(const FwdParams& p) { return select(p) != nullptr; }

bool flash_fwd_wants_aligned_kv(const FwdParams& p) {
  if (!fwd_dispatch::params_ok(p) || p.layout != Layout::kChannelFirst ||
      !sm90_kernels_enabled() || !aligned_row_copies_enabled())
    return false;
  const Widths w = widths(p);
  if (w.kv < 2) return false;
  auto on_lines = [&p](const Strided4& s, int head_dim) {
    return fwd_dispatch::vec_bytes(s, p, head_dim, 2, {128}) == 128;
  };
  if (w.kv == 16 && on_lines(p.k, p.head_dim_qk) && on_lines(p.v, p.head_dim_v)) return false;
  const int width_index = w.kv == 2 ? 0 : w.kv == 4 ? 1 : w.kv == 8 ? 2 : 3;
  return p.seqlen >= kAlignedKVMinSeqlen[width_index] && w.q_out >= 2 &&
         find_sm90_launcher(p, w.q_out, 16) != nullptr;
}

// K and V as tile images, read by CTAs of two or three warpgroups that share each tile (the
// "cft" and "cft3" kernels, flash_fwd_sm90_kernel.cuh; kv_image_kernel picks one), for a copy
// like the aligned rows'. The threshold is the two-warpgroup kernel's, measured on the H200
// (bench/tune/kv_tile_images.py, bf16, split views, copies included;
// bench/results/h200-2026-12-01-12c03e1, column "images 2 wg"), gain over the default before
// them (aligned rows or the views as given): 0.53-0.88x at N = 400, 0.76-0.95x at 1600,
// 0.95-1.07x at 6400, 1.03x at 4,4,12800, 1.10x at 2,2,31250, 1.05x at 1,4,40000, 1.02-1.05x
// at 1,2,62464-62500, 1.09x at 1,1,100000. In fp16 (kv_tile_images_long_fp16.md) they were
// 0.99-1.01x at 12800-62500: neither gain nor loss. So from kKVTileImagesMinSeqlen tokens on
// (every row width gained there in bf16) the caller copies the images;
// PSA_FA2_KV_TILE_IMAGES=0 / 1 / 2 / 3 overrides that (sm90_device.h).
constexpr int kKVTileImagesMinSeqlen = 12800;

bool flash_fwd_wants_kv_tile_images(const FwdParams& p) {
  const CopyChoice choice = kv_tile_images_choice().copy;
  const bool wanted = choice == CopyChoice::kMeasured ? p.seqlen >= kKVTileImagesMinSeqlen
                                                      : choice == CopyChoice::kAlways;
  if (!wanted || p.kv_tile_images || !fwd_dispatch::params_ok(p) ||
      p.layout != Layout::kChannelFirst || !sm90_kernels_enabled() ||
      !aligned_row_copies_enabled())
    return false;
  const Widths w = widths(p);
  // The images' swizzle keys V's rows as K's (copy_rows.cu): K is whole 8-row atoms.
  return w.q_out >= 2 && p.head_dim_qk % 8 == 0 &&
         find_sm90_launcher(p, w.q_out, kv_image_kernel(p)) != nullptr;
}

void flash_fwd(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
