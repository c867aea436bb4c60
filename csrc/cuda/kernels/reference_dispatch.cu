// The reference kernels by dtype (each instantiated in its own instances/reference_*.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launchers.h"

namespace psa_fa2 {

void reference_fwd(const FwdParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat64: return launch_reference_fwd<double>(p, stream);
    case DType::kFloat32: return launch_reference_fwd<float>(p, stream);
    case DType::kBFloat16: return launch_reference_fwd<__nv_bfloat16>(p, stream);
    case DType::kFloat16: return launch_reference_fwd<__half>(p, stream);
  }
}

void reference_bwd(const BwdParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat64: return launch_reference_bwd<double>(p, stream);
    case DType::kFloat32: return launch_reference_bwd<float>(p, stream);
    case DType::kBFloat16: return launch_reference_bwd<__nv_bfloat16>(p, stream);
    case DType::kFloat16: return launch_reference_bwd<__half>(p, stream);
  }
}

}  // namespace psa_fa2
