// plan_fwd / plan_bwd (plan.h): which instance runs a call, on which copies. The thresholds are
// measured choices; docs/design.md says what was measured and bench/tune holds the experiments.
#include "plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "instances/registry.h"
#include "kernels/bwd_copy_width.h"

namespace psa_fa2 {
namespace {

// ---------------------------------------------------------------------------------------------
// Instances
// ---------------------------------------------------------------------------------------------

template <class Instance, size_t kCount, class Kernel, class Read>
int find_instance(const Instance (&table)[kCount], Kernel kernel, DType dtype, int dk, int dv,
                  Layout layout, int vec, Read read, int read_vec) {
  for (size_t i = 0; i < kCount; ++i) {
    const Instance& in = table[i];
    if (in.kernel == kernel && in.dtype == dtype && in.dk == dk && in.dv == dv &&
        in.layout == layout && in.vec_bytes == vec && in.read == read &&
        in.read_vec_bytes == read_vec)
      return int(i);
  }
  return -1;
}

int find_fwd(FwdKernel kernel, const FwdParams& p, int vec, KVRead read, int read_vec) {
  return find_instance(kFwdInstances, kernel, p.dtype, p.head_dim_qk, p.head_dim_v, p.layout,
                       vec, read, read_vec);
}

int find_bwd(BwdKernel kernel, const BwdParams& p, int vec, StreamRead read, int read_vec) {
  return find_instance(kBwdInstances, kernel, p.dtype, p.head_dim_qk, p.head_dim_v, p.layout,
                       vec, read, read_vec);
}

// ---------------------------------------------------------------------------------------------
// Forward: what the kernels assume of a call
// ---------------------------------------------------------------------------------------------

// The layout's unit stride really is 1 (a dimension of size <= 1 never steps).
bool unit_stride_ok(const Strided4& s, const FwdParams& p, int head_dim) {
  return p.layout == Layout::kChannelFirst ? (s.stride_n == 1 || p.seqlen <= 1)
                                           : (s.stride_d == 1 || head_dim <= 1);
}

// The kernels copy and store vectors along the unit-stride dimension, from (b, h, token or d)
// offsets built from the other strides and at token offsets that are multiples of the tile
// size: a width needs a base pointer aligned to it and every other stride a multiple of
// width / elem_bytes elements (strides of size-1 dimensions never step). Returns the first of
// `widths` (widest first) that holds for s, 0 if none does.
int vec_bytes(const Strided4& s, const FwdParams& p, int head_dim, int elem_bytes,
              std::initializer_list<int> widths) {
  const bool cf = p.layout == Layout::kChannelFirst;
  for (int bytes : widths) {
    const int64_t elems = bytes / elem_bytes;
    auto ok = [elems](int64_t stride, int extent) { return extent <= 1 || stride % elems == 0; };
    if (reinterpret_cast<uintptr_t>(s.ptr) % bytes == 0 && ok(s.stride_b, p.batch) &&
        ok(s.stride_h, p.heads) && (cf ? ok(s.stride_d, head_dim) : ok(s.stride_n, p.seqlen))) {
      return bytes;
    }
  }
  return 0;
}

// An lse to write, a scale the kernels can use (the row max is taken on raw scores and scaled
// afterwards, which needs scale >= 0), sane sizes, unit strides.
bool fwd_params_ok(const FwdParams& p) {
  if (p.lse == nullptr) return false;
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale)) return false;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return false;
  return unit_stride_ok(p.q, p, p.head_dim_qk) && unit_stride_ok(p.k, p, p.head_dim_qk) &&
         unit_stride_ok(p.v, p, p.head_dim_v) && unit_stride_ok(p.out, p, p.head_dim_v);
}

// The widest 2-byte access widths (16, 8, 4 or 2 bytes) that Q and out, and K and V, allow.
struct Widths {
  int q_out, kv;
  int common() const { return std::min(q_out, kv); }
};

Widths half_widths(const FwdParams& p) {
  auto width = [&p](const Strided4& s, int head_dim) {
    return vec_bytes(s, p, head_dim, 2, {16, 8, 4, 2});
  };
  return {std::min(width(p.q, p.head_dim_qk), width(p.out, p.head_dim_v)),
          std::min(width(p.k, p.head_dim_qk), width(p.v, p.head_dim_v))};
}

// ---------------------------------------------------------------------------------------------
// Forward, bf16 / fp16
// ---------------------------------------------------------------------------------------------

// Channel-first K / V rows start at multiples of N elements: at N % 8 != 0 that limits the wgmma
// kernel's copies of K and V (every CTA streams all of them) to 8, 4 or 2 bytes, and at
// N % 64 != 0 their 64-key tiles straddle 128-byte lines. From these many tokens on (per K / V
// row width: 2, 4, 8, and 16 bytes but not 128), copying K and V to 128-byte aligned rows first
// pays for the copy.
constexpr int64_t kAlignedKVMinSeqlen[4] = {400, 1600, 6400, 1600};

// From this many tokens on, K and V copied to tile images (each 64-key tile one contiguous,
// pre-swizzled block, fetched by one bulk copy) pay for the copy at every row width.
constexpr int kKVTileImagesMinSeqlen = 12800;

struct Sm90Fwd {
  const FwdParams& p;
  const DeviceDesc& device;
  const PlanOverrides& overrides;

  bool enabled() const { return device.sm90_kernels && !overrides.no_sm90; }
  bool copies() const { return !overrides.no_copies; }

  int find(int vec, KVRead read, int read_vec) const {
    return enabled() ? find_fwd(FwdKernel::kWgmma, p, vec, read, read_vec) : -1;
  }

  // Which kernel reads the tile images: CTAs of two warpgroups (128 rows, two CTAs per SM,
  // steps of 64 keys) or of three (192 rows, one per SM, steps of 128). What decides is mostly
  // how the CTAs fall on the SMs: the kernel whose busiest SM has fewer rows to work through,
  // counting full waves and then the rest spread over the SMs; the three-warpgroup rows count
  // 0.93 of the others', since an SM gets through them about 7% faster.
  KVRead image_kernel() const {
    const int forced = overrides.kv_image_warpgroups;
    if (forced == 2 || forced == 3) {
      return forced == 3 ? KVRead::kTileImages3wg : KVRead::kTileImages2wg;
    }
    const int64_t sms = device.multiprocessors;
    if (sms <= 0) return KVRead::kTileImages2wg;
    const int64_t heads = int64_t(p.batch) * p.heads;
    auto rows_per_sm = [&](int64_t rows, int64_t per_sm) {
      const int64_t ctas = (p.seqlen + rows - 1) / rows * heads;
      const int64_t full_waves = ctas / (per_sm * sms);
      const int64_t rest = ctas - full_waves * per_sm * sms;
      return (full_waves * per_sm + (rest + sms - 1) / sms) * rows;
    };
    return rows_per_sm(192, 1) * 93 <= rows_per_sm(128, 2) * 100 ? KVRead::kTileImages3wg
                                                                  : KVRead::kTileImages2wg;
  }

  bool wants_tile_images() const {
    const Choice choice = overrides.kv_images;
    const bool wanted = choice == Choice::kAuto ? p.seqlen >= kKVTileImagesMinSeqlen
                                                : choice == Choice::kAlways;
    if (!wanted || !enabled() || !copies() || p.layout != Layout::kChannelFirst) return false;
    const Widths w = half_widths(p);
    // The images' swizzle keys V's rows as K's (copy_rows.cu): K is whole 8-row atoms.
    return w.q_out >= 2 && p.head_dim_qk % 8 == 0 && find(w.q_out, image_kernel(), 16) >= 0;
  }

  bool wants_aligned_kv() const {
    if (!enabled() || !copies() || p.layout != Layout::kChannelFirst) return false;
    const Widths w = half_widths(p);
    if (w.kv < 2) return false;
    auto on_lines = [this](const Strided4& s, int head_dim) {
      return vec_bytes(s, p, head_dim, 2, {128}) == 128;
    };
    if (w.kv == 16 && on_lines(p.k, p.head_dim_qk) && on_lines(p.v, p.head_dim_v)) return false;
    const int width_index = w.kv == 2 ? 0 : w.kv == 4 ? 1 : w.kv == 8 ? 2 : 3;
    return p.seqlen >= kAlignedKVMinSeqlen[width_index] && w.q_out >= 2 &&
           find(w.q_out, KVRead::kRows, 16) >= 0;
  }
};

// The instance for the rows as given: token-major instances exist for 16-byte rows only,
// channel-first ones for every width >= 2.
int half_fwd_instance(const FwdParams& p, const Sm90Fwd& sm90) {
  const Widths w = half_widths(p);
  const int vec = w.common();
  if (!(vec == 16 || (p.layout == Layout::kChannelFirst && vec >= 2))) return -1;
  // K and V on 16-byte rows, Q or out not.
  if (w.kv == 16 && w.q_out < 16) {
    if (int i = sm90.find(w.q_out, KVRead::kRows, 16); i >= 0) return i;
  }
  if (int i = sm90.find(vec, KVRead::kRows, vec); i >= 0) return i;
  return find_fwd(FwdKernel::kMmaSync, p, vec, KVRead::kRows, vec);
}

void plan_half_fwd(const FwdParams& p, const DeviceDesc& device, const PlanOverrides& overrides,
                   FwdPlan& plan) {
  if (!fwd_params_ok(p)) return;
  const Sm90Fwd sm90{p, device, overrides};
  plan.instance = half_fwd_instance(p, sm90);
  if (plan.instance < 0) return;
  if (sm90.wants_tile_images()) {
    plan.instance = sm90.find(half_widths(p).q_out, sm90.image_kernel(), 16);
    plan.copy = FwdCopy::kKVTileImages;
  } else if (sm90.wants_aligned_kv()) {
    plan.instance = sm90.find(half_widths(p).q_out, KVRead::kRows, 16);
    plan.copy = FwdCopy::kAlignedKV;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward, fp32
// ---------------------------------------------------------------------------------------------

void plan_f32_fwd(const FwdParams& p, const DeviceDesc& device, const PlanOverrides& overrides,
                  FwdPlan& plan) {
  if (!fwd_params_ok(p)) return;
  int vec = vec_bytes(p.q, p, p.head_dim_qk, 4, {16, 4});
  for (int x : {vec_bytes(p.k, p, p.head_dim_qk, 4, {16, 4}),
                vec_bytes(p.v, p, p.head_dim_v, 4, {16, 4}),
                vec_bytes(p.out, p, p.head_dim_v, 4, {16, 4})}) {
    vec = std::min(vec, x);
  }
  if (vec == 0) return;
  // TF32 where allowed and instantiated; else the exact kernel (more accurate than asked for).
  if (p.allow_tf32) plan.instance = find_fwd(FwdKernel::kTf32, p, vec, KVRead::kRows, vec);
  if (plan.instance < 0) plan.instance = find_fwd(FwdKernel::kFfma, p, vec, KVRead::kRows, vec);
  if (plan.instance < 0 || overrides.no_f32_kv_splits) return;
  // Grids of fewer CTAs than SMs: as many CTAs per row tile as fit the SMs once over, each
  // taking a run of the key tiles, up to one tile each and kMaxKvSplits.
  const int64_t row_tiles = (int64_t(p.seqlen) + kF32FwdRowsPerCta - 1) / kF32FwdRowsPerCta;
  const int64_t ctas = int64_t(p.batch) * p.heads * row_tiles;
  const int64_t sms = device.multiprocessors;
  const int64_t key_tiles =
      (int64_t(p.seqlen) + kF32FwdMaxKeysPerTile - 1) / kF32FwdMaxKeysPerTile;
  if (ctas == 0 || ctas >= sms) return;
  plan.kv_splits = int(std::min<int64_t>({sms / ctas, key_tiles, kMaxKvSplits}));
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// Under TF32, the FFMA fp32 backward measured slower than the blockwise path's TF32 matmuls at
// 400 tokens and faster from 1600 on.
constexpr int kFp32BackwardFfmaMinTokensTf32 = 1600;

// Channel-first Q and dO rows start at multiples of N elements: at N % 8 != 0 that limits the
// wgmma backward's copies of them (every CTA streams all of them) to 8, 4 or 2 bytes, and at
// N % 64 != 0 their 64-row tiles straddle 128-byte lines. From these many tokens on (per row
// width: 2, 4, 8, and 16 bytes but not 128), copying Q and dO to 128-byte aligned rows pays.
constexpr int64_t kAlignedStreamMinSeqlen[4] = {1600, 6400, 6400, 6400};

// Stream images take the copies of Q, dO, lse and D out of the wgmma backward's steps. They
// replace the aligned row copies wherever those are made, and rows that need no copy from this
// many tokens on.
constexpr int64_t kStreamImagesUncopiedMinSeqlen = 12800;

// Token-major tiles move as 16-byte chunks: bases 16-byte aligned, strides multiples of 8
// elements. Channel-first tiles only need unit stride along N; the launcher picks the copy
// width (16, 8, 4 or 2 bytes) that the pointers and strides allow.
bool bwd_tensor_ok(const Strided4& s, Layout layout, int batch, int heads, int n) {
  if (s.ptr == nullptr) return false;
  if (layout == Layout::kChannelFirst) {
    return (s.stride_n == 1 || n <= 1) && (reinterpret_cast<uintptr_t>(s.ptr) & 1) == 0;
  }
  auto mult8 = [](int64_t stride, int64_t extent) { return extent <= 1 || stride % 8 == 0; };
  return (reinterpret_cast<uintptr_t>(s.ptr) & 15) == 0 && mult8(s.stride_b, batch) &&
         mult8(s.stride_h, heads) && s.stride_d == 1 && mult8(s.stride_n, n);
}

// The mma.sync kernel covers p (every fast backward runs only where it does).
int sm80_bwd_instance(const BwdParams& p) {
  const int i = find_bwd(BwdKernel::kMmaSync, p, 0, StreamRead::kRows, 0);
  if (i < 0) return -1;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return -1;
  // The int32 token arithmetic inside a head needs N well below 2^31.
  if (p.seqlen > (1 << 30)) return -1;
  if (p.lse == nullptr || (reinterpret_cast<uintptr_t>(p.lse) & 3) != 0) return -1;
  for (const Strided4* s : {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv})
    if (!bwd_tensor_ok(*s, p.layout, p.batch, p.heads, p.seqlen)) return -1;
  return i;
}

struct Sm90Bwd {
  const BwdParams& p;
  const DeviceDesc& device;
  const PlanOverrides& overrides;

  int find(int vec, StreamRead read, int read_vec) const {
    if (!device.sm90_kernels || overrides.no_sm90) return -1;
    return find_bwd(BwdKernel::kWgmma, p, vec, read, read_vec);
  }
  // The copy width of K, V, out and the gradients (Q and dO are streamed, and may be copied).
  int others_width() const {
    const Strided4* const others[] = {&p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv};
    return fbwd::granularity_of(p, others);
  }
  // The instance on the rows as given.
  int on_rows() const {
    if (p.layout == Layout::kTokenMajor) return find(16, StreamRead::kRows, 16);
    const int vec = fbwd::channel_first_granularity(p);
    if (int i = find(vec, StreamRead::kRows, fbwd::stream_granularity(p)); i >= 0) return i;
    return find(vec, StreamRead::kRows, vec);
  }
  int on_aligned_rows() const { return find(others_width(), StreamRead::kRows, 16); }
  int on_stream_images() const { return find(others_width(), StreamRead::kStreamImages, 16); }

  bool may_copy() const {
    return p.layout == Layout::kChannelFirst && !overrides.no_copies && on_rows() >= 0;
  }
  bool wants_aligned_rows() const {
    if (!may_copy()) return false;
    const int stream = fbwd::stream_granularity(p);
    const Strided4* const streamed[] = {&p.q, &p.dout};
    if (stream == 16 && fbwd::granularity_of(p, streamed, 128) == 128) return false;
    const int width_index = stream == 2 ? 0 : stream == 4 ? 1 : stream == 8 ? 2 : 3;
    return p.seqlen >= kAlignedStreamMinSeqlen[width_index] && on_aligned_rows() >= 0;
  }
  bool wants_stream_images() const {
    const Choice choice = overrides.stream_images;
    if (choice == Choice::kNever || !may_copy()) return false;
    if (choice == Choice::kAuto && p.seqlen < kStreamImagesUncopiedMinSeqlen &&
        !wants_aligned_rows())
      return false;
    return on_stream_images() >= 0;
  }
};

// The FFMA fp32 backward: one CTA per 64-key tile unless that leaves SMs idle; then enough
// pieces of the query stream per tile for two CTAs per SM, each of at least two 32-row steps.
int f32_row_pieces(const BwdParams& p, const DeviceDesc& device) {
  const int64_t tiles = int64_t(p.batch) * p.heads * ((p.seqlen + 63) / 64);
  const int64_t sms = device.multiprocessors;
  if (tiles == 0 || tiles >= sms) return 1;
  const int64_t steps = (p.seqlen + 31) / 32;
  return int(std::clamp<int64_t>((2 * sms + tiles - 1) / tiles, 1,
                                 std::max<int64_t>(1, steps / 2)));
}

void plan_f32_bwd(const BwdParams& p, const DeviceDesc& device, BwdPlan& plan) {
  // The FFMA kernel (exact arithmetic) where instantiated, under TF32 only from
  // kFp32BackwardFfmaMinTokensTf32 tokens on, and not where results must be bit-reproducible
  // (its atomics are not); else blockwise on at::matmul, which follows PyTorch's fp32 matmul
  // rule (TF32 unless "highest") and is deterministic.
  plan.kernel = BwdKernel::kBlockwise;
  if (p.deterministic || (p.allow_tf32 && p.seqlen < kFp32BackwardFfmaMinTokensTf32)) return;
  const int i = find_bwd(BwdKernel::kFfma, p, 0, StreamRead::kRows, 0);
  if (i < 0) return;
  plan.kernel = BwdKernel::kFfma;
  plan.instance = i;
  plan.f32_row_pieces = f32_row_pieces(p, device);
}

}  // namespace

namespace {

// A GPU that runs none of this build's kernels (below compute capability 8.0, or no code for
// it in the build): blockwise on at::matmul, whatever impl asks for.
bool runs_kernels(const DeviceDesc& device, const PlanOverrides& overrides) {
  return device.runs_kernels && !overrides.as_if_no_kernels;
}

bool fits(int smem_bytes, const DeviceDesc& device, const PlanOverrides& overrides) {
  const int limit = overrides.smem_per_block > 0 ? overrides.smem_per_block : device.smem_per_block;
  return limit <= 0 || smem_bytes <= limit;
}

}  // namespace

FwdPlan plan_fwd(const FwdParams& p, Impl impl, const DeviceDesc& device,
                 const PlanOverrides& overrides) {
  FwdPlan plan;
  if (!runs_kernels(device, overrides)) {
    plan.kernel = FwdKernel::kBlockwise;
    if (impl != Impl::kReference) plan.fallback = Fallback::kDeviceRunsNoKernels;
    return plan;
  }
  if (impl == Impl::kReference) return plan;
  if (p.dtype == DType::kFloat32) {
    plan_f32_fwd(p, device, overrides, plan);
  } else if (p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16) {
    plan_half_fwd(p, device, overrides, plan);
  }
  if (plan.instance < 0) {
    plan = FwdPlan{};
    plan.fallback = Fallback::kNoInstance;
    return plan;
  }
  if (!fits(kFwdInstances[plan.instance].smem_bytes, device, overrides)) {
    plan = FwdPlan{};
    plan.kernel = FwdKernel::kBlockwise;
    plan.fallback = Fallback::kSharedMemory;
    return plan;
  }
  plan.kernel = kFwdInstances[plan.instance].kernel;
  return plan;
}

BwdPlan plan_bwd(const BwdParams& p, Impl impl, const DeviceDesc& device,
                 const PlanOverrides& overrides) {
  BwdPlan plan;
  if (!runs_kernels(device, overrides)) {
    plan.kernel = BwdKernel::kBlockwise;
    if (impl != Impl::kReference) plan.fallback = Fallback::kDeviceRunsNoKernels;
    return plan;
  }
  if (impl == Impl::kReference) return plan;
  if (p.dtype == DType::kFloat32) {
    plan_f32_bwd(p, device, plan);
    if (plan.instance >= 0 && !fits(kBwdInstances[plan.instance].smem_bytes, device, overrides)) {
      plan = BwdPlan{};
      plan.kernel = BwdKernel::kBlockwise;  // what fp32 runs where the FFMA kernel does not
    }
    return plan;
  }
  const int sm80 = sm80_bwd_instance(p);
  if (sm80 < 0) {
    plan.fallback = Fallback::kNoInstance;
    return plan;
  }
  if (!fits(kBwdInstances[sm80].smem_bytes, device, overrides)) {
    plan.kernel = BwdKernel::kBlockwise;
    plan.fallback = Fallback::kSharedMemory;
    return plan;
  }
  const int64_t bh = int64_t(p.batch) * p.heads;
  plan.kernel = BwdKernel::kMmaSync;
  plan.instance = sm80;
  plan.schedule = p.deterministic ? BwdSchedule::kCombined : BwdSchedule::kAtomicDQ;
  if (plan.schedule == BwdSchedule::kAtomicDQ) {
    // The dQ accumulators: fp32 [B * H][N rounded up to 64][dk].
    plan.workspace_bytes =
        sizeof(float) * size_t(bh) * size_t((p.seqlen + 63) / 64 * 64) * p.head_dim_qk;
    const Sm90Bwd sm90{p, device, overrides};
    if (const int rows = sm90.on_rows(); rows >= 0) {
      plan.kernel = BwdKernel::kWgmma;
      plan.instance = rows;
      if (sm90.wants_stream_images()) {
        plan.instance = sm90.on_stream_images();
        plan.copy = BwdCopy::kQdOStreamImages;
      } else if (sm90.wants_aligned_rows()) {
        plan.instance = sm90.on_aligned_rows();
        plan.copy = BwdCopy::kAlignedQdO;
      }
      plan.tail = plan_sm90_bwd_tail_split(p.seqlen, int(bh), device.multiprocessors);
      plan.workspace_bytes +=
          bwd_tail_split_bytes(plan.tail, kSm90BwdKeysPerCta * (p.head_dim_qk + p.head_dim_v));
    }
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

namespace {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat64: return "fp64";
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "?";
}

template <class Instance>
std::string instance_name(const Instance& in) {
  return std::string(dtype_name(in.dtype)) + " " + std::to_string(in.dk) + "x" +
         std::to_string(in.dv) + " " +
         (in.layout == Layout::kChannelFirst ? "channel_first" : "token_major");
}

std::string bytes(int vec) { return std::to_string(vec) + "B"; }

}  // namespace

std::string describe(const FwdPlan& plan) {
  if (plan.kernel == FwdKernel::kBlockwise) {
    return plan.fallback == Fallback::kSharedMemory
               ? "blockwise forward on at::matmul (no fast kernel fits the GPU's shared memory)"
               : "blockwise forward on at::matmul (the GPU runs none of this build's kernels)";
  }
  if (plan.instance < 0) return "reference forward (one query row per CTA)";
  const FwdInstance& in = kFwdInstances[plan.instance];
  std::string s;
  switch (in.kernel) {
    case FwdKernel::kMmaSync:
      s = "mma.sync forward " + instance_name(in) + " rows " + bytes(in.vec_bytes) +
          "; CTA 64 query rows x 64-key tiles";
      break;
    case FwdKernel::kFfma:
    case FwdKernel::kTf32:
      s = std::string(in.kernel == FwdKernel::kFfma ? "FFMA" : "TF32 mma.sync") + " forward " +
          instance_name(in) + " rows " + bytes(in.vec_bytes) + "; CTA 128 query rows x " +
          (in.dk + in.dv <= 96 ? "64" : "32") + "-key tiles, " +
          std::to_string(plan.kv_splits) + " CTA(s) per row tile";
      break;
    case FwdKernel::kWgmma: {
      s = "wgmma forward " + instance_name(in) + " q/out " + bytes(in.vec_bytes) + ", K/V ";
      if (in.read == KVRead::kRows) {
        s += "rows " + bytes(in.read_vec_bytes) + "; CTA 64 query rows x 64-key steps";
      } else if (in.read == KVRead::kTileImages2wg) {
        s += "tile images; CTA 2 warpgroups, 128 query rows x 64-key steps";
      } else {
        s += "tile images; CTA 3 warpgroups, 192 query rows x 128-key steps";
      }
      break;
    }
    case FwdKernel::kReference:
    case FwdKernel::kBlockwise:
      break;
  }
  if (plan.copy == FwdCopy::kAlignedKV) s += "; copies K, V to 128-byte aligned rows";
  if (plan.copy == FwdCopy::kKVTileImages) s += "; copies K, V to tile images";
  return s;
}

std::string describe(const BwdPlan& plan) {
  switch (plan.kernel) {
    case BwdKernel::kReference:
      return "reference backward (one query row per CTA)";
    case BwdKernel::kBlockwise:
      return "blockwise backward on at::matmul (fp32: TF32 where allowed, deterministic)";
    case BwdKernel::kFfma:
      return "FFMA backward " + instance_name(kBwdInstances[plan.instance]) +
             "; CTA 64 keys x 32-row steps, " + std::to_string(plan.f32_row_pieces) +
             " CTA(s) per key tile";
    case BwdKernel::kMmaSync:
      return "mma.sync backward " + instance_name(kBwdInstances[plan.instance]) +
             (plan.schedule == BwdSchedule::kAtomicDQ
                  ? "; atomic-dQ schedule, CTA 128 keys"
                  : "; combined schedule (deterministic), CTA 128 query rows");
    case BwdKernel::kWgmma: {
      const BwdInstance& in = kBwdInstances[plan.instance];
      std::string s = "wgmma backward " + instance_name(in) + " rows " + bytes(in.vec_bytes) +
                      ", Q/dO " +
                      (in.read == StreamRead::kRows ? "rows " + bytes(in.read_vec_bytes)
                                                    : std::string("stream images")) +
                      "; CTA 128 keys x 64-row steps";
      if (plan.tail.pieces > 1) {
        s += ", last wave split " + std::to_string(plan.tail.pieces) + " ways";
      }
      if (plan.copy == BwdCopy::kAlignedQdO) s += "; copies Q, dO to 128-byte aligned rows";
      if (plan.copy == BwdCopy::kQdOStreamImages) s += "; copies Q, dO to stream images";
      return s;
    }
  }
  return "?";
}

}  // namespace psa_fa2
