// Operator schemas (defined once) and the compiled module's build facts.
// Kernels register themselves per dispatch key beside their code:
// cpu/attention_cpu.cpp (CPU), cuda/attention_cuda.cpp (CUDA), and psa_attention.cpp
// (psa_attention's and attention's autograd, device-agnostic).
#include <Python.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "cpu/tile_math.h"

#ifndef PSA_FA2_VERSION
#define PSA_FA2_VERSION "0.0.0"
#endif
#ifndef PSA_FA2_TORCH_VERSION
#define PSA_FA2_TORCH_VERSION "unknown"
#endif
#ifndef PSA_FA2_CUDA_ARCHS
#define PSA_FA2_CUDA_ARCHS ""
#endif

#ifdef PSA_FA2_WITH_CUDA
#include <cuda_runtime_api.h>
namespace psa_fa2 {
std::vector<std::string> compiled_cuda_kernels();  // cuda/attention_cuda.cpp
}
#endif

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
  // v [B, H, dv, N] -> [B, H, dv, N] contiguous. Differentiable (psa_attention.cpp).
  m.def("psa_attention(Tensor q, Tensor k, Tensor v, float scale, str impl=\"auto\") -> Tensor");
  // The same on q, k [B, H, N, dk], v [B, H, N, dv] of any layout -> [B, H, N, dv] in theirs
  // (token-major when they share none). Differentiable (psa_attention.cpp).
  m.def("attention(Tensor q, Tensor k, Tensor v, float scale, str impl=\"auto\") -> Tensor");
}

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = PSA_FA2_VERSION;
  info["torch_version"] = PSA_FA2_TORCH_VERSION;
#ifdef PSA_FA2_WITH_CUDA
  info["cuda"] = true;
  info["cuda_version"] = std::to_string(CUDART_VERSION / 1000) + "." +
                         std::to_string((CUDART_VERSION % 1000) / 10);
  info["cuda_archs"] = std::string(PSA_FA2_CUDA_ARCHS);
  info["cuda_kernels"] = psa_fa2::compiled_cuda_kernels();
#else
  info["cuda"] = false;
  info["cuda_version"] = pybind11::none();
  info["cuda_archs"] = "";
  info["cuda_kernels"] = std::vector<std::string>{};
#endif
  // Which copy of the CPU tile math this CPU runs (cpu/tile_math.h).
  info["cpu_isa"] = std::string(psa_fa2::cpu::tile_math_isa());
  return info;
}

}  // namespace

// Importing the module runs the TORCH_LIBRARY registrations above and in the kernels' files.
PYBIND11_MODULE(_C, m) {
  m.doc() = "psa_fa2_ext compiled kernels; the operators live in torch.ops.psa_fa2";
  m.def("build_info", &build_info,
        "Version, torch version, which CUDA kernels were built, and the CPU kernels' ISA.");
  m.def("_force_cpu_isa", [](const std::string& isa) { psa_fa2::cpu::force_tile_math(isa.c_str()); },
        "Tests only: run the CPU tile math's \"avx2\" or \"baseline\" copy, or \"auto\".");
}
