// Fills the CUDA kernels' params structs from validated tensors (launch.cpp).
#pragma once

#include <ATen/ATen.h>

#include "../checks.h"
#include "attention_params.h"

namespace psa_fa2 {

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return DType::kFloat64;
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    default: return DType::kFloat16;  // check_fwd_inputs admitted nothing else
  }
}

template <typename Params>
void fill_shape(Params& p, const AttnShape& s, at::ScalarType dtype, double scale) {
  p.batch = s.batch;
  p.heads = s.heads;
  p.seqlen = s.seqlen;
  p.head_dim_qk = s.head_dim_qk;
  p.head_dim_v = s.head_dim_v;
  p.scale = scale;
  p.dtype = to_dtype(dtype);
  p.layout = s.layout;
}

inline FwdParams make_fwd_params(const AttnShape& s, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& lse, double scale) {
  FwdParams p{};
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  p.out = strided(out);
  p.lse = lse.data_ptr();
  fill_shape(p, s, q.scalar_type(), scale);
  return p;
}

// The scratch (delta, the workspace) is the caller's to set.
inline BwdParams make_bwd_params(const AttnShape& s, const at::Tensor& dout, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                                 const at::Tensor& dv, double scale) {
  BwdParams p{};
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  p.out = strided(out);
  p.dout = strided(dout);
  p.dq = strided(dq);
  p.dk = strided(dk);
  p.dv = strided(dv);
  p.lse = lse.data_ptr();
  fill_shape(p, s, q.scalar_type(), scale);
  return p;
}

}  // namespace psa_fa2
