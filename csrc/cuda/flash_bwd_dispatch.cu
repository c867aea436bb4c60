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

// The Hopper kernel for schedule (a), if it may run and covers p.
Sm90Fn find_sm90(const BwdParams& p) {
  if (!sm90_kernels_enabled()) return nullptr;
  const int vec = p.layout == Layout::kTokenMajor ? 16 : fbwd::channel_first_granularity(p);
#define PSA_FA2_MATCH(dt, dk, dv, lay, width)                                              \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&                 \
      p.layout == Layout::lay && vec == width)                                             \
    return &flash_bwd_sm90_instance<DType::dt, dk, dv, Layout::lay, width>;
  PSA_FA2_BWD_SM90_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
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
  if (p.lse == nullptr || p.delta == nullptr) return false;
  if ((reinterpret_cast<uintptr_t>(p.lse) & 3) != 0 || (reinterpret_cast<uintptr_t>(p.delta) & 3) != 0)
    return false;
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
