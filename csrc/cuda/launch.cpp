// CUDA implementations of torch.ops.psa_fa2.{fwd,bwd}: validate, fill the params struct, ask
// plan.h what to run, make the copies it asks for, and launch on the current stream.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "../blockwise_attention.h"
#include "../build_facts.h"
#include "../checks.h"
#include "aligned_rows.h"
#include "device_desc.h"
#include "device_support.h"
#include "grid_chunks.h"
#include "kernels/kv_split_scratch.h"
#include "kernels/launchers.h"
#include "make_params.h"
#include "plan.h"

namespace psa_fa2 {

namespace {
// Set only by psa_fa2_ext._testing.force (set_plan_overrides), between calls.
PlanOverrides g_overrides;
}  // namespace

void set_plan_overrides(const PlanOverrides& overrides) { g_overrides = overrides; }

bool current_device_runs_kernels() {
  return current_device_support().support == DeviceSupport::kSupported;
}

namespace {

// PyTorch's matmul rule for fp32: TF32 tensor cores unless the precision is "highest".
bool fp32_matmul_allows_tf32() { return at::globalContext().allowTF32CuBLAS(); }

// Where the current device runs none of this build's kernels, what a user reads once: which
// GPU, why, what runs instead, and how to get the kernels. Empty where it runs them. Called
// with the inputs' device current; raises only where the CUDA runtime cannot report on it.
std::string unsupported_device_note(const at::Tensor& t) {
  const DeviceReport report = current_device_support();
  if (report.support == DeviceSupport::kSupported) return {};
  TORCH_CHECK(report.support != DeviceSupport::kNoDevice,
              "psa_fa2: the CUDA runtime could not report on ", t.device().str());
  // Strings only (messages.h says why).
  const std::string capability = std::to_string(report.major) + "." + std::to_string(report.minor);
  // Hopper's wgmma kernels are sm_90a code, which an arch list names as such.
  const std::string arch = capability == "9.0" ? "9.0a" : capability;
  const std::string device = std::string(at::cuda::getCurrentDeviceProperties()->name) + " (" +
                             t.device().str() + ", compute capability " + capability + ")";
  if (report.support == DeviceSupport::kTooOld) {
    return "psa_fa2's kernels need compute capability 8.0 (Ampere) or newer, and the inputs are "
           "on " + device + ": attention runs blockwise on at::matmul instead (correct, memory "
           "O(block x N), slower)";
  }
  return std::string("psa_fa2 was built for CUDA archs \"") + built_cuda_archs() +
         "\", which have no code that " + device + " can run: attention runs blockwise on "
         "at::matmul instead (correct, slower); for the kernels, reinstall it with "
         "TORCH_CUDA_ARCH_LIST=\"" + arch + "\" (or build it on a machine with this GPU, whose "
         "arch the build picks by default)";
}

// The plan's view of the current device.
DeviceDesc device_for(const std::string& unsupported_note) {
  DeviceDesc device = current_device_desc();
  device.runs_kernels = unsupported_note.empty();
  return device;
}

// The note a call gives where its plan runs blockwise for want of kernels: the device's, or
// the test hook's (as_if_no_kernels) on a device that has them.
std::string no_kernels_note(const std::string& unsupported_note) {
  if (!unsupported_note.empty() || !g_overrides.as_if_no_kernels) return unsupported_note;
  return "psa_fa2: planned as on a GPU that runs none of this build's kernels "
         "(psa_fa2_ext._testing.force): attention runs blockwise on at::matmul";
}

std::string describe_config(const AttnShape& s, at::ScalarType dtype) {
  return std::string(c10::toString(dtype)) + ", dk = " + std::to_string(s.head_dim_qk) +
         ", dv = " + std::to_string(s.head_dim_v) + ", " + layout_name(s.layout);
}

// Raises for impl="fast" where the plan runs no fast kernel; warns once for impl="auto".
void check_fast_kernel(Fallback fallback, Impl impl, const AttnShape& s, at::ScalarType dtype,
                       const char* direction, const std::string& unsupported_note,
                       const DeviceDesc& device) {
  if (fallback == Fallback::kNone) return;
  if (fallback == Fallback::kDeviceRunsNoKernels) {
    TORCH_CHECK(impl != Impl::kFast, "impl=\"fast\": ", unsupported_note);
    TORCH_WARN_ONCE(unsupported_note);
    return;
  }
  if (fallback == Fallback::kSharedMemory) {
    const std::string note =
        std::string("psa_fa2: the fast ") + direction + " kernel for " +
        describe_config(s, dtype) + " needs more shared memory per block than " +
        at::cuda::getCurrentDeviceProperties()->name + " has (" +
        std::to_string((g_overrides.smem_per_block > 0 ? g_overrides.smem_per_block
                                                       : device.smem_per_block) / 1024) +
        " KB): running blockwise on at::matmul "
        "(correct, slower)";
    TORCH_CHECK(impl != Impl::kFast, "impl=\"fast\": ", note);
    TORCH_WARN_ONCE(note);
    return;
  }
  TORCH_CHECK(impl != Impl::kFast, "impl=\"fast\": no fast ", direction, " kernel for ",
              describe_config(s, dtype), " (pointers 16-byte aligned and strides multiples of 8 "
              "are needed too); use impl=\"auto\" or \"reference\"");
  TORCH_WARN_ONCE("psa_fa2: no fast ", direction, " kernel for ", describe_config(s, dtype),
                  "; running the reference kernel, which is correct but slow");
}

// One launch's share of a call's [B, H, ...] tensor (grid_chunks.h); the tensor itself for a
// call of one launch.
at::Tensor chunk_of(const at::Tensor& t, const GridChunk& c) {
  if (c.whole) return t;
  return t.narrow(0, c.batch0, c.batches).narrow(1, c.head0, c.heads);
}
AttnShape chunk_of(AttnShape s, const GridChunk& c) {
  s.batch = c.batches;
  s.heads = c.heads;
  return s;
}

// The forward of one launch: B * H within the grid's cap, out and lse allocated.
void fwd_launch(const AttnShape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                double scale, Impl impl, const std::string& unsupported_note, at::Tensor out,
                at::Tensor lse) {
  FwdParams p = make_fwd_params(s, q, k, v, out, lse, scale);
  p.allow_tf32 = fp32_matmul_allows_tf32();
  const DeviceDesc device = device_for(unsupported_note);
  const FwdPlan plan = plan_fwd(p, impl, device, g_overrides);
  check_fast_kernel(plan.fallback, impl, s, q.scalar_type(), "forward",
                    no_kernels_note(unsupported_note), device);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (plan.kernel == FwdKernel::kBlockwise) {
    // blockwise_fwd writes into its out and lse arguments, which may be views of the call's.
    blockwise_fwd(q, k, v, scale, out, lse, kBlockwiseElemsCuda);
    return;
  }
  if (plan.instance < 0) {
    reference_fwd(p, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // Copies and scratch are freed after the launches; the allocator reuses them in stream order.
  at::Tensor copies, split_scratch;
  if (plan.copy == FwdCopy::kKVTileImages) {
    copies = kv_tile_images_copy(k, v, stream);
    p.k.ptr = copies.data_ptr();  // the images: k's strides and v are not read
    p.v.ptr = nullptr;
  } else if (plan.copy == FwdCopy::kAlignedKV) {
    const auto [k_rows, v_rows] = aligned_kv_copy(k, v, stream);
    p.k = strided(k_rows);
    p.v = strided(v_rows);
    copies = k_rows;  // v_rows views the same allocation
  }
  if (plan.kv_splits > 1) {
    split_scratch = at::empty({int64_t(KvSplitScratch(p, plan.kv_splits).floats())},
                              q.options().dtype(at::kFloat));
    p.kv_splits = plan.kv_splits;
    p.kv_split_scratch = split_scratch.data_ptr();
  }
  kFwdLaunchers[plan.instance](p, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, double scale,
                                            c10::string_view impl_name) {
  const AttnShape s = check_fwd_inputs(q, k, v);
  const Impl impl = parse_impl(impl_name);
  const c10::cuda::CUDAGuard guard(q.device());
  const std::string unsupported_note = unsupported_device_note(q);
  at::Tensor out = empty_output_like(q, s, s.layout, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads, s.seqlen},
                             q.options().dtype(accumulate_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  for_each_grid_chunk(s.batch, s.heads, [&](const GridChunk& c) {
    fwd_launch(chunk_of(s, c), chunk_of(q, c), chunk_of(k, c), chunk_of(v, c), scale, impl,
               unsupported_note, chunk_of(out, c), chunk_of(lse, c));
  });
  return {out, lse};
}

// The backward of one launch: B * H within the grid's cap, no tensor empty.
void bwd_launch(const AttnShape& s, const at::Tensor& dout, const at::Tensor& q,
                const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                const at::Tensor& lse, double scale, at::Tensor dq, at::Tensor dk, at::Tensor dv,
                Impl impl, const std::string& unsupported_note,
                bool deterministic, bool accumulate) {
  BwdParams p = make_bwd_params(s, dout, q, k, v, out, lse, dq, dk, dv, scale);
  p.allow_tf32 = fp32_matmul_allows_tf32();
  p.deterministic = deterministic;
  p.accumulate = accumulate;
  const DeviceDesc device = device_for(unsupported_note);
  const BwdPlan plan = plan_bwd(p, impl, device, g_overrides);
  check_fast_kernel(plan.fallback, impl, s, q.scalar_type(), "backward",
                    no_kernels_note(unsupported_note), device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  if (plan.kernel == BwdKernel::kBlockwise) {
    if (!accumulate) zero_qk_grads(dq, dk);
    blockwise_bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, kBlockwiseElemsCuda);
    return;
  }
  // delta ([B, H, N] of lse's dtype: rowsum(dout * out)) and the fast kernel's workspace in one
  // allocation: at the shipped shapes a training step is host-bound, and every allocation is
  // host time. It is freed after the launches, in stream order.
  const int64_t delta_bytes = (lse.numel() * int64_t(lse.element_size()) + 255) / 256 * 256;
  const at::Tensor scratch = at::empty({delta_bytes + int64_t(plan.workspace_bytes)},
                                       q.options().dtype(at::kByte));
  p.delta = scratch.data_ptr();
  if (plan.workspace_bytes > 0) p.workspace = static_cast<char*>(scratch.data_ptr()) + delta_bytes;

  switch (plan.kernel) {
    case BwdKernel::kReference:
      // The reference kernel's dq / dk atomics add one finished value per element to what is
      // there, so its result does not depend on their order: deterministic as it stands.
      if (!accumulate) zero_qk_grads(dq, dk);
      reference_bwd(p, stream);
      break;
    case BwdKernel::kFfma: {
      if (!accumulate) zero_qk_grads(dq, dk);
      // Added to in place, dq would take one rounded fp32 addition per key tile at the size of
      // what it holds (and dk one per CTA, where CTAs share key tiles): accumulating, their
      // gradients are summed from zero instead and added once.
      const bool shared_tiles = plan.f32_row_pieces > 1;
      const at::Tensor dq_sum = accumulate ? at::zeros_like(dq) : dq;
      const at::Tensor dk_sum = accumulate && shared_tiles ? at::zeros_like(dk) : dk;
      if (shared_tiles) dv.zero_();
      p.dq = strided(dq_sum);
      p.dk = strided(dk_sum);
      kBwdLaunchers[plan.instance](p, plan, stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (accumulate) dq.add_(dq_sum);
      if (accumulate && shared_tiles) dk.add_(dk_sum);
      return;
    }
    case BwdKernel::kMmaSync:
    case BwdKernel::kWgmma: {
      // Freed after the launch, in stream order.
      at::Tensor copies;
      if (plan.copy == BwdCopy::kQdOStreamImages) {
        copies = stream_tile_images_copy(q, dout, stream);
        p.stream_tile_images = copies.data_ptr();
      } else if (plan.copy == BwdCopy::kAlignedQdO) {
        const std::vector<at::Tensor> rows =
            aligned_rows_copy({{q, s.head_dim_qk}, {dout, s.head_dim_v}},
                              {s.head_dim_qk, s.head_dim_v}, stream);
        p.q = strided(rows[0]);
        p.dout = strided(rows[1]);
        copies = rows[0];  // rows[1] views the same allocation
      }
      kBwdLaunchers[plan.instance](p, plan, stream);
      break;
    }
    case BwdKernel::kBlockwise:
      break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bwd_cuda(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, double scale,
              at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, c10::string_view impl_name,
              bool deterministic, bool accumulate) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  const Impl impl = parse_impl(impl_name);
  const c10::cuda::CUDAGuard guard(q.device());
  const std::string unsupported_note = unsupported_device_note(q);
  if (q.numel() == 0 || v.numel() == 0) {
    if (!accumulate) zero_qk_grads(dq, dk);
    return;
  }
  deterministic = deterministic || at::globalContext().deterministicAlgorithms();
  for_each_grid_chunk(s.batch, s.heads, [&](const GridChunk& c) {
    bwd_launch(chunk_of(s, c), chunk_of(dout, c), chunk_of(q, c), chunk_of(k, c), chunk_of(v, c),
               chunk_of(out, c), chunk_of(lse, c), scale, chunk_of(dq, c), chunk_of(dk, c),
               chunk_of(dv, c), impl, unsupported_note, deterministic, accumulate);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
}

}  // namespace psa_fa2
