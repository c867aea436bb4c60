// Operator schemas (defined once) and the compiled module's bindings.
// Kernels register themselves per dispatch key beside their code:
// cpu/attention_cpu.cpp (CPU), cuda/launch.cpp (CUDA), and autograd/psa_attention.cpp
// (psa_attention's and attention's autograd, device-agnostic).
#include <Python.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "build_facts.h"
#include "cpu/tile_math.h"
#include "cuda/grid_chunks.h"
#include "cuda/instances/registry.h"
#include "cuda/plan.h"

TORCH_LIBRARY(psa_fa2, m) {
  // q, k: [B, H, N, dk]; v: [B, H, N, dv]; token-major (stride(-1) == 1) or channel-first
  // (stride(-2) == 1). Returns out [B, H, N, dv] in the inputs' layout and lse [B, H, N]
  // (natural log; fp32, fp64 for float64 inputs).
  m.def("fwd(Tensor q, Tensor k, Tensor v, float scale, str impl=\"auto\") -> (Tensor, Tensor)");
  // The seed's contract: dq and dk are accumulated into (+=), dv is overwritten, so two
  // calls on the halves of V (and of out / dout) add up to the full-V gradient.
  // accumulate=False overwrites dq and dk too (no zero-filled buffers needed).
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, "
      "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, str impl=\"auto\", "
      "bool deterministic=False, bool accumulate=True) -> ()");
  // The Ultralytics block's attention on its channel-first views: q, k [B, H, dk, N],
  // v [B, H, dv, N] -> [B, H, dv, N] contiguous. area > 1: attention within each of `area`
  // equal runs of N (YOLO12's area attention), read in place. Differentiable
  // (psa_attention.cpp).
  m.def("psa_attention(Tensor q, Tensor k, Tensor v, float scale, str impl=\"auto\", "
        "int area=1) -> Tensor");
  // The same on q, k [B, H, N, dk], v [B, H, N, dv] of any layout -> [B, H, N, dv] in theirs
  // (token-major when they share none). Differentiable (psa_attention.cpp).
  m.def("attention(Tensor q, Tensor k, Tensor v, float scale, str impl=\"auto\") -> Tensor");
}

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = PSA_FA2_VERSION;
  info["torch_version"] = PSA_FA2_TORCH_VERSION;
  const psa_fa2::BuildFacts facts = psa_fa2::build_facts();
  info["cuda"] = facts.cuda;
  info["cuda_version"] = facts.cuda ? pybind11::object(pybind11::str(facts.cuda_version))
                                    : pybind11::object(pybind11::none());
  info["cuda_archs"] = facts.cuda_archs;
  info["cuda_kernels"] = facts.cuda_kernels;
  // Which copy of the CPU tile math this CPU runs (cpu/tile_math.h).
  info["cpu_isa"] = std::string(psa_fa2::cpu::tile_math_isa());
  return info;
}

// A logical [B, H, N, D] tensor as the plan sees it: (byte offset from a 256-byte aligned base,
// stride_b, stride_h, stride_n, stride_d). Only the offset's alignment matters to the plan.
using TensorDesc = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;

psa_fa2::Strided4 strided_desc(const TensorDesc& t) {
  const auto [offset, sb, sh, sn, sd] = t;
  return {reinterpret_cast<void*>(uintptr_t(256 + offset)), sb, sh, sn, sd};
}

psa_fa2::DType dtype_from(const std::string& name) {
  if (name == "float64") return psa_fa2::DType::kFloat64;
  if (name == "float32") return psa_fa2::DType::kFloat32;
  if (name == "bfloat16") return psa_fa2::DType::kBFloat16;
  if (name == "float16") return psa_fa2::DType::kFloat16;
  throw pybind11::value_error("dtype: expected float64, float32, bfloat16 or float16, got " + name);
}

psa_fa2::Impl impl_from(const std::string& name) {
  if (name == "auto") return psa_fa2::Impl::kAuto;
  if (name == "fast") return psa_fa2::Impl::kFast;
  if (name == "reference") return psa_fa2::Impl::kReference;
  throw pybind11::value_error("impl: expected auto, fast or reference, got " + name);
}

// What psa_fa2_ext._testing.force and _plan pass: the private PlanOverrides fields by name.
psa_fa2::PlanOverrides overrides_from(const pybind11::dict& d) {
  psa_fa2::PlanOverrides o;
  auto choice = [](const std::string& c) {
    if (c == "never") return psa_fa2::Choice::kNever;
    if (c == "always") return psa_fa2::Choice::kAlways;
    if (c == "auto") return psa_fa2::Choice::kAuto;
    throw pybind11::value_error("expected auto, never or always, got " + c);
  };
  for (const auto& [key, value] : d) {
    const std::string k = pybind11::str(key);
    if (k == "no_sm90") o.no_sm90 = value.cast<bool>();
    else if (k == "no_copies") o.no_copies = value.cast<bool>();
    else if (k == "no_f32_kv_splits") o.no_f32_kv_splits = value.cast<bool>();
    else if (k == "kv_images") o.kv_images = choice(value.cast<std::string>());
    else if (k == "kv_image_warpgroups") o.kv_image_warpgroups = value.cast<int>();
    else if (k == "stream_images") o.stream_images = choice(value.cast<std::string>());
    else if (k == "as_if_no_kernels") o.as_if_no_kernels = value.cast<bool>();
    else if (k == "smem_per_block") o.smem_per_block = value.cast<int>();
    else throw pybind11::value_error("unknown plan override: " + k);
  }
  return o;
}

// plan_fwd / plan_bwd (cuda/plan.h) for a described call and device; the same code the CUDA
// ops run, compiled in every build. Returns (description, fields).
pybind11::tuple plan_call(const std::string& direction, const std::string& dtype,
                          bool channel_first, int batch, int heads, int seqlen, int dk, int dv,
                          const std::vector<TensorDesc>& tensors, bool allow_tf32,
                          bool deterministic, const std::string& impl,
                          std::tuple<int, int, int, int, bool, bool> device,
                          const pybind11::dict& force) {
  psa_fa2::DeviceDesc d;
  std::tie(d.major, d.minor, d.multiprocessors, d.smem_per_block, d.sm90_kernels,
           d.runs_kernels) = device;
  const psa_fa2::PlanOverrides o = overrides_from(force);
  const psa_fa2::Layout layout =
      channel_first ? psa_fa2::Layout::kChannelFirst : psa_fa2::Layout::kTokenMajor;
  static int lse_storage;  // only its alignment is looked at
  // A call beyond the grid's B * H cap runs as launches of its own plans (grid_chunks.h): the
  // first launch's plan stands for all of them.
  const int64_t launches = psa_fa2::grid_chunk_count(batch, heads);
  const psa_fa2::GridChunk first = psa_fa2::first_grid_chunk(batch, heads);
  batch = int(first.batches);
  heads = int(first.heads);
  const std::string in_launches =
      launches > 1 ? "; in " + std::to_string(launches) + " launches, as the grid's y dimension "
                         "holds at most " + std::to_string(psa_fa2::kMaxGridY) + " (b, h) pairs; "
                         "the first launch's plan is shown"
                   : "";
  pybind11::dict fields;
  fields["launches"] = launches;
  if (direction == "fwd") {
    if (tensors.size() != 4) throw pybind11::value_error("fwd: tensors are q, k, v, out");
    psa_fa2::FwdParams p{};
    p.q = strided_desc(tensors[0]), p.k = strided_desc(tensors[1]);
    p.v = strided_desc(tensors[2]), p.out = strided_desc(tensors[3]);
    p.lse = &lse_storage;
    p.batch = batch, p.heads = heads, p.seqlen = seqlen, p.head_dim_qk = dk, p.head_dim_v = dv;
    p.scale = 1.0 / std::sqrt(double(dk));
    p.dtype = dtype_from(dtype), p.layout = layout, p.allow_tf32 = allow_tf32;
    const psa_fa2::FwdPlan plan = psa_fa2::plan_fwd(p, impl_from(impl), d, o);
    fields["kernel"] = int(plan.kernel);
    fields["instance"] = plan.instance;
    fields["copy"] = int(plan.copy);
    fields["kv_splits"] = plan.kv_splits;
    fields["fallback"] = int(plan.fallback);
    fields["no_fast_kernel"] = plan.fallback != psa_fa2::Fallback::kNone;
    fields["smem_bytes"] = plan.instance >= 0 ? psa_fa2::kFwdInstances[plan.instance].smem_bytes : 0;
    return pybind11::make_tuple(psa_fa2::describe(plan) + in_launches, fields);
  }
  if (direction != "bwd") throw pybind11::value_error("direction: expected fwd or bwd");
  if (tensors.size() != 8) {
    throw pybind11::value_error("bwd: tensors are q, k, v, out, dout, dq, dk, dv");
  }
  psa_fa2::BwdParams p{};
  psa_fa2::Strided4* all[] = {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv};
  for (int i = 0; i < 8; ++i) *all[i] = strided_desc(tensors[i]);
  p.lse = &lse_storage;
  p.batch = batch, p.heads = heads, p.seqlen = seqlen, p.head_dim_qk = dk, p.head_dim_v = dv;
  p.scale = 1.0 / std::sqrt(double(dk));
  p.dtype = dtype_from(dtype), p.layout = layout, p.allow_tf32 = allow_tf32;
  p.deterministic = deterministic;
  const psa_fa2::BwdPlan plan = psa_fa2::plan_bwd(p, impl_from(impl), d, o);
  fields["kernel"] = int(plan.kernel);
  fields["instance"] = plan.instance;
  fields["copy"] = int(plan.copy);
  fields["schedule"] = int(plan.schedule);
  fields["f32_row_pieces"] = plan.f32_row_pieces;
  fields["tail_pieces"] = plan.tail.pieces;
  fields["workspace_bytes"] = plan.workspace_bytes;
  fields["fallback"] = int(plan.fallback);
  fields["no_fast_kernel"] = plan.fallback != psa_fa2::Fallback::kNone;
  fields["smem_bytes"] = plan.instance >= 0 ? psa_fa2::kBwdInstances[plan.instance].smem_bytes : 0;
  return pybind11::make_tuple(psa_fa2::describe(plan) + in_launches, fields);
}

}  // namespace

// Importing the module runs the TORCH_LIBRARY registrations above and in the kernels' files.
PYBIND11_MODULE(_C, m) {
  m.doc() = "psa_fa2_ext compiled kernels; the operators live in torch.ops.psa_fa2";
  m.def("build_info", &build_info,
        "Version, torch version, which CUDA kernels were built, and the CPU kernels' ISA.");
  m.def("_force_cpu_isa", [](const std::string& isa) { psa_fa2::cpu::force_tile_math(isa.c_str()); },
        "Tests only: run the CPU tile math's \"avx2\" or \"baseline\" copy, or \"auto\".");
  m.def("_plan", &plan_call, "The plan of a described call on a described device (cuda/plan.h).");
  m.def("_force", [](const pybind11::dict& d) { psa_fa2::set_plan_overrides(overrides_from(d)); },
        "Tests only: plan the CUDA ops' calls with these overrides ({} for none).");
  m.def("_current_device_runs_kernels", &psa_fa2::current_device_runs_kernels,
        "Whether the current GPU runs this build's kernels (else calls run blockwise).");
}
