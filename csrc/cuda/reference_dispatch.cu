// dtype switch for the reference kernels (instantiated in reference_{fwd,bwd}_*.cu).
#include "launchers.h"
#include "reference_instances.h"

namespace psa_fa2 {

template <typename Params>
static void dispatch_reference(const Params& p, cudaStream_t stream,
                               void (*f64)(const Params&, cudaStream_t),
                               void (*f32)(const Params&, cudaStream_t),
                               void (*bf16)(const Params&, cudaStream_t),
                               void (*f16)(const Params&, cudaStream_t)) {
  switch (p.dtype) {
    case DType::kFloat64: return f64(p, stream);
    case DType::kFloat32: return f32(p, stream);
    case DType::kBFloat16: return bf16(p, stream);
    case DType::kFloat16: return f16(p, stream);
  }
}

void reference_fwd(const FwdParams& p, cudaStream_t stream) {
  using namespace reference;
  dispatch_reference<FwdParams>(p, stream, fwd<double>, fwd<float>, fwd<__nv_bfloat16>, fwd<__half>);
}

void reference_bwd(const BwdParams& p, cudaStream_t stream) {
  using namespace reference;
  dispatch_reference<BwdParams>(p, stream, bwd<double>, bwd<float>, bwd<__nv_bfloat16>, bwd<__half>);
}

}  // namespace psa_fa2
