// CUDA implementations of torch.ops.psa_fa2.{fwd,bwd}: validate, fill the params struct,
// pick the kernel (fast tensor-core kernel, or the reference kernel), launch on the
// current stream.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "../checks.h"
#include "../blockwise_attention.h"
#include "aligned_rows.h"
#include "device_support.h"
#include "make_params.h"
#include "launchers.h"

namespace psa_fa2 {

std::vector<std::string> compiled_cuda_kernels() {
  std::vector<std::string> kernels = {"reference_fwd", "reference_bwd", "flash_fwd",
                                      "flash_fwd_f32", "flash_bwd",    "flash_bwd_f32",
                                      "blockwise_bwd_f32"};
#if defined(PSA_FA2_WITH_SM90A)
  kernels.push_back("flash_fwd_sm90");  // wgmma, runs on compute capability 9.0 devices
  kernels.push_back("flash_bwd_sm90");  // wgmma schedule (a)
#endif
  return kernels;
}

namespace {

// PyTorch's matmul rule for fp32: TF32 tensor cores unless the precision is "highest".
bool fp32_matmul_allows_tf32() { return at::globalContext().allowTF32CuBLAS(); }

// Under TF32, forward + backward with the fp32 backward's FFMA kernel ran 0.83-0.90x as fast as
// with the blockwise path's TF32 matmuls at 16,4,400, 16,2,400 and 64,4,400, and 1.05-1.12x at
// 16,4,1600, 8,4,6400 and 1,2,62500 (H200; bench/results/h200-2026-12-02-3b01cf6 against
// ../h200-2026-12-02-bfa1805). Between 400 and 1600 tokens it was not timed.
constexpr int kFp32BackwardFfmaMinTokensTf32 = 1600;

#ifndef PSA_FA2_CUDA_ARCHS
#define PSA_FA2_CUDA_ARCHS ""
#endif

// Raises, naming the device and what this build covers, where the current device cannot run
// the kernels; called with the inputs' device current.
void check_device_supported(const at::Tensor& t) {
  const DeviceReport report = current_device_support();
  if (report.support == DeviceSupport::kSupported) return;
  // Strings only (checks.h says why).
  const std::string capability = std::to_string(report.major) + "." + std::to_string(report.minor);
  // Hopper's wgmma kernels are sm_90a code, which an arch list names as such.
  const std::string arch = capability == "9.0" ? "9.0a" : capability;
  const std::string device = std::string(at::cuda::getCurrentDeviceProperties()->name) + " (" +
                             t.device().str() + ", compute capability " + capability + ")";
  TORCH_CHECK(report.support != DeviceSupport::kTooOld, "psa_fa2 needs an NVIDIA GPU of compute "
              "capability 8.0 (Ampere) or newer; the inputs are on ", device);
  TORCH_CHECK(report.support != DeviceSupport::kNotBuiltFor, "psa_fa2 was built for CUDA archs \"",
              PSA_FA2_CUDA_ARCHS, "\", which have no code that ", device, " can run; reinstall "
              "it with TORCH_CUDA_ARCH_LIST=\"", arch, "\" (or build it "
              "on a machine with this GPU, whose arch the build picks by default)");
  TORCH_CHECK(false, "psa_fa2: the CUDA runtime could not report on ", t.device().str());
}

std::string describe_config(const AttnShape& s, at::ScalarType dtype) {
  return std::string(c10::toString(dtype)) + ", dk = " + std::to_string(s.head_dim_qk) +
         ", dv = " + std::to_string(s.head_dim_v) + ", " + layout_name(s.layout);
}

// Whether to run the fast kernel; fails for impl="fast" when none covers the call.
bool use_fast(Impl impl, bool supported, const AttnShape& s, at::ScalarType dtype,
              const char* direction) {
  if (impl == Impl::kReference) return false;
  if (supported) return true;
  TORCH_CHECK(impl != Impl::kFast, "impl=\"fast\": no fast ", direction, " kernel for ",
              describe_config(s, dtype), " (pointers 16-byte aligned and strides multiples of 8 "
              "are needed too); use impl=\"auto\" or \"reference\"");
  TORCH_WARN_ONCE("psa_fa2: no fast ", direction, " kernel for ", describe_config(s, dtype),
                  "; running the reference kernel, which is correct but slow");
  return false;
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, double scale,
                                            c10::string_view impl_name) {
  const AttnShape s = check_fwd_inputs(q, k, v);
  const Impl impl = parse_impl(impl_name);
  const c10::cuda::CUDAGuard guard(q.device());
  check_device_supported(q);
  at::Tensor out = empty_in_layout(s, s.head_dim_v, s.layout, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads, s.seqlen},
                             q.options().dtype(accumulate_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};

  FwdParams p = make_fwd_params(s, q, k, v, out, lse, scale);
  p.allow_tf32 = fp32_matmul_allows_tf32();

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool fp32 = p.dtype == DType::kFloat32;
  const bool fast_supported = fp32 ? flash_fwd_f32_supported(p) : flash_fwd_supported(p);
  if (use_fast(impl, fast_supported, s, q.scalar_type(), "forward")) {
    if (fp32) {
      // Small grids share each row tile's keys among CTAs; the scratch is freed after the
      // launches, and the allocator reuses it in stream order.
      at::Tensor split_scratch;
      if (const int splits = flash_fwd_f32_kv_splits(p); splits > 1) {
        split_scratch = at::empty({int64_t(flash_fwd_f32_split_scratch_bytes(p, splits))},
                                  q.options().dtype(at::kByte));
        p.kv_splits = splits;
        p.kv_split_scratch = split_scratch.data_ptr();
      }
      flash_fwd_f32(p, stream);
    } else if (flash_fwd_wants_kv_tile_images(p)) {
      // The images are freed after the launch; the allocator reuses them in stream order.
      const at::Tensor images = kv_tile_images_copy(k, v, stream);
      FwdParams tiled = p;
      tiled.k.ptr = images.data_ptr();
      tiled.v.ptr = nullptr;
      tiled.kv_tile_images = true;
      flash_fwd(tiled, stream);
    } else if (flash_fwd_wants_aligned_kv(p)) {
      // The copies are freed after the launch; the allocator reuses them in stream order.
      const auto [k_rows, v_rows] = aligned_kv_copy(k, v, stream);
      FwdParams aligned = p;
      aligned.k = strided(k_rows);
      aligned.v = strided(v_rows);
      flash_fwd(aligned, stream);
    } else {
      flash_fwd(p, stream);
    }
  } else {
    reference_fwd(p, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, lse};
}

void bwd_cuda(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, double scale,
              at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, c10::string_view impl_name,
              bool deterministic, bool accumulate) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  const Impl impl = parse_impl(impl_name);
  const c10::cuda::CUDAGuard guard(q.device());
  check_device_supported(q);
  if (q.numel() == 0 || v.numel() == 0) {
    if (!accumulate) zero_qk_grads(dq, dk);
    return;
  }
  BwdParams p = make_bwd_params(s, dout, q, k, v, out, lse, dq, dk, dv, scale);
  p.allow_tf32 = fp32_matmul_allows_tf32();
  p.deterministic = deterministic || at::globalContext().deterministicAlgorithms();
  p.accumulate = accumulate;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool fp32 = q.scalar_type() == at::kFloat && impl != Impl::kReference;
  const bool fast =
      !fp32 && use_fast(impl, flash_bwd_supported(p), s, q.scalar_type(), "backward");
  // delta ([B, H, N] of lse's dtype: rowsum(dout * out)) and the fast kernel's workspace in one
  // allocation: at the shipped shapes a training step is host-bound, and every allocation is
  // host time. It is freed after the launches, in stream order.
  const int64_t delta_bytes = (lse.numel() * int64_t(lse.element_size()) + 255) / 256 * 256;
  const int64_t workspace_bytes = fast ? int64_t(flash_bwd_workspace_bytes(p)) : 0;
  const at::Tensor scratch =
      at::empty({delta_bytes + workspace_bytes}, q.options().dtype(at::kByte));
  p.delta = scratch.data_ptr();
  if (fast) p.workspace = static_cast<char*>(scratch.data_ptr()) + delta_bytes;

  // fp32: the FFMA kernel where it is instantiated (exact arithmetic; under TF32 from
  // kFp32BackwardFfmaMinTokensTf32 tokens on, where it measured faster than TF32 matmuls),
  // unless the results must be bit-reproducible (its atomics are not); else blockwise on
  // at::matmul, which follows PyTorch's fp32 matmul rule (TF32 unless "highest") and is
  // deterministic.
  if (fp32) {
    if (!accumulate) zero_qk_grads(dq, dk);
    const bool ffma = !p.deterministic && flash_bwd_f32_supported(p) &&
                      (!p.allow_tf32 || s.seqlen >= kFp32BackwardFfmaMinTokensTf32);
    if (ffma) {
      // Added to in place, dq would take one rounded fp32 addition per key tile at the size of
      // what it holds (and dk one per CTA, where CTAs share key tiles): accumulating, their
      // gradients are summed from zero instead and added once.
      const int pieces = flash_bwd_f32_row_pieces(p);
      const at::Tensor dq_sum = accumulate ? at::zeros_like(dq) : dq;
      const at::Tensor dk_sum = accumulate && pieces > 1 ? at::zeros_like(dk) : dk;
      if (pieces > 1) dv.zero_();
      BwdParams sums = p;
      sums.dq = strided(dq_sum);
      sums.dk = strided(dk_sum);
      flash_bwd_f32(sums, pieces, stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (accumulate) dq.add_(dq_sum);
      if (accumulate && pieces > 1) dk.add_(dk_sum);
    } else {
      blockwise_bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, kBlockwiseElemsCuda);
    }
    return;
  }
  if (fast) {
    if (flash_bwd_wants_stream_tile_images(p)) {
      // Freed after the launch, in stream order, like the row copies below.
      const at::Tensor images = stream_tile_images_copy(q, dout, stream);
      BwdParams streamed = p;
      streamed.stream_tile_images = images.data_ptr();
      flash_bwd(streamed, stream);
    } else if (flash_bwd_wants_aligned_stream(p)) {
      // Q and dO on aligned rows; the copies are freed after the launch, in stream order.
      const std::vector<at::Tensor> rows =
          aligned_rows_copy({{q, s.head_dim_qk}, {dout, s.head_dim_v}},
                            {s.head_dim_qk, s.head_dim_v}, stream);
      BwdParams aligned = p;
      aligned.q = strided(rows[0]);
      aligned.dout = strided(rows[1]);
      flash_bwd(aligned, stream);
    } else {
      flash_bwd(p, stream);
    }
  } else {
    // The reference kernel's dq / dk atomics add one finished value per element to what is
    // there, so its result does not depend on their order: deterministic as it stands.
    if (!accumulate) zero_qk_grads(dq, dk);
    reference_bwd(p, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
}

}  // namespace psa_fa2
