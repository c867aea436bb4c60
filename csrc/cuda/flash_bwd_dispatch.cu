// Host dispatch of the fast backward: (dtype, dk, dv, layout) -> instantiation, plus the
// checks that decide when the caller must fall back to reference_bwd.
//
// Schedule (a) on Hopper: when sm90_kernels_enabled() (sm90_device.h: an sm_90a build on a
// compute capability 9.0 device, PSA_FA2_DISABLE_SM90 not 1), the wgmma kernel of
// flash_bwd_sm90_kernel.cuh runs where it has an instantiation ((32, 64), bf16 / fp16), on the
// same workspace; the mma.sync kernel everywhere else, and for schedule (b) always.
#include <cstdint>

#include "bwd_copy_width.h"
#include "bwd_tail_split.h"
#include "flash_bwd_instances.h"
#include "flash_bwd_sm90_instances.h"
#include "launchers.h"
#include "sm90_device.h"

namespace psa_fa2 {
namespace {

using RunFn = void (*)(const BwdParams&, BwdSchedule, cudaStream_t);
using WsFn = size_t (*)(const BwdParams&, BwdSchedule);

struct Instance {
  DType dtype;
  int dk, dv;
  Layout layout;
  RunFn run;
  WsFn workspace;
};

#define PSA_FA2_BWD_ENTRY(DT, DK, DV, L)                                              \
  Instance{DType::DT, DK, DV, Layout::L, &flash_bwd_instance<DType::DT, DK, DV, Layout::L>, \
           &flash_bwd_instance_workspace<DType::DT, DK, DV, Layout::L>},
constexpr Instance kInstances[] = {PSA_FA2_BWD_INSTANCES(PSA_FA2_BWD_ENTRY)};
#undef PSA_FA2_BWD_ENTRY

const Instance* find(const BwdParams& p) {
  for (const Instance& in : kInstances)
    if (in.dtype == p.dtype && in.dk == p.head_dim_qk && in.dv == p.head_dim_v &&
        in.layout == p.layout)
      return &in;
  return nullptr;
}

using Sm90Fn = void (*)(const BwdParams&, cudaStream_t);

// The Hopper kernel for schedule (a) at these copy widths, if it may run and covers p.
Sm90Fn find_sm90_with(const BwdParams& p, int vec, int stream_vec) {
  if (!sm90_kernels_enabled()) return nullptr;
#define PSA_FA2_MATCH(dt, dk, dv, lay, width, stream_width)                                \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&                 \
      p.layout == Layout::lay && vec == width && stream_vec == stream_width)               \
    return &flash_bwd_sm90_instance<DType::dt, dk, dv, Layout::lay, width, stream_width>;
  PSA_FA2_BWD_SM90_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
}

// The same at p's widths: Q and dO at their own where an instantiation has it ("cfs"), else at
// the common one.
// The Hopper kernel on stream images (stream_tile_images.h) of p's Q and dO, the others at
// their common width.
Sm90Fn find_sm90_on_stream_images(const BwdParams& p) {
  const Strided4* const others[] = {&p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv};
  return find_sm90_with(p, fbwd::granularity_of(p, others), kStreamTileImages);
}

Sm90Fn find_sm90(const BwdParams& p) {
  if (p.layout == Layout::kTokenMajor) return find_sm90_with(p, 16, 16);
  if (p.stream_tile_images != nullptr) return find_sm90_on_stream_images(p);
  const int vec = fbwd::channel_first_granularity(p);
  if (Sm90Fn run = find_sm90_with(p, vec, fbwd::stream_granularity(p))) return run;
  return find_sm90_with(p, vec, vec);
}

BwdSchedule resolve(const BwdParams& p, BwdSchedule s) {
  if (s != BwdSchedule::kAuto) return s;
  return p.deterministic ? BwdSchedule::kCombined : BwdSchedule::kAtomicDQ;
}

// Token-major tiles move as 16-byte chunks: bases 16-byte aligned, strides multiples of 8
// elements. Channel-first tiles only need unit stride along N; the launcher picks the copy
// width (16, 8, 4 or 2 bytes) that the pointers and strides allow.
bool tensor_ok(const Strided4& s, Layout layout, int batch, int heads, int n) {
  if (s.ptr == nullptr) return false;
  if (layout == Layout::kChannelFirst) {
    return (s.stride_n == 1 || n <= 1) && (reinterpret_cast<uintptr_t>(s.ptr) & 1) == 0;
  }
  auto mult8 = [](int64_t stride, int64_t extent) { return extent <= 1 || stride % 8 == 0; };
  return (reinterpret_cast<uintptr_t>(s.ptr) & 15) == 0 && mult8(s.stride_b, batch) &&
         mult8(s.stride_h, heads) && s.stride_d == 1 && mult8(s.stride_n, n);
}

}  // namespace

bool flash_bwd_supported_with(const BwdParams& p, BwdSchedule schedule) {
  (void)schedule;  // both schedules cover the same inputs
  if (find(p) == nullptr) return false;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return false;
  // grid.y is B*H; the int32 token arithmetic inside a head needs N well below 2^31.
  if (int64_t(p.batch) * p.heads > 65535 || p.seqlen > (1 << 30)) return false;
  // delta and the workspace are not looked at: the caller allocates them for the kernel.
  if (p.lse == nullptr || (reinterpret_cast<uintptr_t>(p.lse) & 3) != 0) return false;
  const Strided4* all[] = {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv};
  for (const Strided4* s : all)
    if (!tensor_ok(*s, p.layout, p.batch, p.heads, p.seqlen)) return false;
  return true;
}

size_t flash_bwd_workspace_bytes_with(const BwdParams& p, BwdSchedule schedule) {
  const Instance* in = find(p);
  if (in == nullptr) return 0;
  const BwdSchedule resolved = resolve(p, schedule);
  size_t bytes = in->workspace(p, resolved);
  if (resolved == BwdSchedule::kAtomicDQ && find_sm90(p) != nullptr) {
    // The wgmma kernel's tail split (bwd_tail_split.h) after its dQ workspace.
    const BwdTailSplit split =
        plan_sm90_bwd_tail_split(p.seqlen, p.batch * p.heads, current_device_multiprocessors());
    bytes += bwd_tail_split_bytes(split, kSm90BwdKeysPerCta * (p.head_dim_qk + p.head_dim_v));
  }
  return bytes;
}

void flash_bwd_with(const BwdParams& p, BwdSchedule schedule, cudaStream_t stream) {
  const Instance* in = find(p);
  if (in == nullptr) return;
  const BwdSchedule resolved = resolve(p, schedule);
  if (resolved == BwdSchedule::kAtomicDQ) {
    if (Sm90Fn run = find_sm90(p)) return run(p, stream);
  }
  in->run(p, resolved, stream);
}

// Channel-first Q and dO rows start at multiples of N elements: at N % 8 != 0 that limits the
// wgmma backward's copies of them (every CTA streams all of them) to 8, 4 or 2 bytes, and at
// N % 64 != 0 their 64-row tiles straddle 128-byte lines. From these many tokens on (per row
// width; 16: rows 16-byte aligned but not 128), the caller copies Q and dO to 128-byte aligned
// rows first (flash_bwd_wants_aligned_stream, attention_cuda.cpp); K, V and the rest keep
// their width ("cfs" instantiations). Measured on the H200 as the forward's copies
// (flash_fwd_dispatch.cu; bench/results/h200-2026-12-01-44d4e11/aligned_rows_ab.md), gain
// with the copies:
//   2-byte rows (odd N):    0.98x at 401, 1.31x at 1601, 1.42x at 6401, 1.41x at 62499;
//   4-byte (N % 4 == 2):    0.89x at 402, 1.01x at 1602, 1.06x at 6402;
//   8-byte (N % 8 == 4):    0.87x at 404, 0.99x at 1604, 1.03x at 6404, 1.06x at 62500;
//   16-byte, not 128:       0.81x at 400, 0.99x at 1608, 1.05x at 6408, 1.06x at 62504.
// Copying K and V as well (each CTA loads them once) moved it by -1.7% to +1.5% at 6401-62499
// (bench/results/h200-2026-12-01-44d4e11/bwd_kv_copies_ab.md): not done.
// PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN overrides all four (experiments);
// PSA_FA2_DISABLE_ALIGNED_COPIES=1 turns the copies off at run time (sm90_device.h).
#if defined(PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN)
constexpr int64_t kAlignedStreamMinSeqlen[4] = {
    PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN, PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN,
    PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN, PSA_FA2_ALIGNED_STREAM_MIN_SEQLEN};
#else
constexpr int64_t kAlignedStreamMinSeqlen[4] = {1600, 6400, 6400, 6400};  // 2, 4, 8, 16-byte rows
#endif

namespace {

// Whether the caller may copy p's Q and dO for the wgmma backward (to aligned rows or stream
// images): channel-first, copies enabled, and schedule (a) running on the wgmma kernel.
bool may_copy_stream(const BwdParams& p) {
  return p.layout == Layout::kChannelFirst && aligned_row_copies_enabled() &&
         flash_bwd_supported(p) && resolve(p, BwdSchedule::kAuto) == BwdSchedule::kAtomicDQ &&
         find_sm90(p) != nullptr;
}

}  // namespace

bool flash_bwd_wants_aligned_stream(const BwdParams& p) {
  if (!may_copy_stream(p)) return false;
  const int stream = fbwd::stream_granularity(p);
  const Strided4* const streamed[] = {&p.q, &p.dout};
  if (stream == 16 && fbwd::granularity_of(p, streamed, 128) == 128) return false;
  const int width_index = stream == 2 ? 0 : stream == 4 ? 1 : stream == 8 ? 2 : 3;
  if (p.seqlen < kAlignedStreamMinSeqlen[width_index]) return false;
  // The others keep their width, Q and dO become 16-byte: that instantiation must exist.
  const Strided4* const others[] = {&p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv};
  return find_sm90_with(p, fbwd::granularity_of(p, others), 16) != nullptr;
}

// Stream images (stream_tile_images.h) take the copies of Q, dO, lse and D out of the wgmma
// backward's steps: one thread fetches each step's with bulk copies, and the kernel on them
// computes dQ on wgmma (PSA_FA2_BWD90_DQ_WGMMA). They cost a copy of Q and dO: they replace
// the aligned row copies wherever those are made, and rows that need no copy from this many
// tokens on. On an H100 (bench/tune/bwd_stream_images.py, bf16, copies included; bench/results/
// h100-2026-12-05-dc5b46a), images against rows: 1.10x at 16,4,1601, 1.09x at 8,4,6401, 1.14x
// at 1,2,62500; where the views need no copy, 0.77x at 16,4,400, 0.99x at 16,4,1600, 1.04x
// at 8,4,6400 (fp16 0.99x), 1.05x at 2,4,12800, 1.11x at 1,2,62464.
// PSA_FA2_BWD_STREAM_IMAGES, read per call, overrides this: 1 wherever the kernel can, 0 never.
constexpr int64_t kStreamImagesUncopiedMinSeqlen = 12800;

bool flash_bwd_wants_stream_tile_images(const BwdParams& p) {
  const CopyChoice choice = stream_tile_images_choice();
  if (choice == CopyChoice::kNever || !may_copy_stream(p)) return false;
  if (choice == CopyChoice::kMeasured && p.seqlen < kStreamImagesUncopiedMinSeqlen &&
      !flash_bwd_wants_aligned_stream(p))
    return false;
  return find_sm90_on_stream_images(p) != nullptr;
}

bool flash_bwd_supported(const BwdParams& p) {
  return flash_bwd_supported_with(p, BwdSchedule::kAuto);
}
size_t flash_bwd_workspace_bytes(const BwdParams& p) {
  return flash_bwd_workspace_bytes_with(p, BwdSchedule::kAuto);
}
void flash_bwd(const BwdParams& p, cudaStream_t stream) {
  flash_bwd_with(p, BwdSchedule::kAuto, stream);
}

}  // namespace psa_fa2
