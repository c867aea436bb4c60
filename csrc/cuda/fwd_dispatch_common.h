// What the fast forward kernels (bf16 / fp16 and fp32) assume of a call, shared by their
// dispatchers (flash_fwd_dispatch.cu, flash_fwd_f32_dispatch.cu).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "attention_params.h"

namespace psa_fa2 {
namespace fwd_dispatch {

// The layout's unit stride really is 1 (a dimension of size <= 1 never steps).
inline bool unit_stride_ok(const Strided4& s, const FwdParams& p, int head_dim) {
  return p.layout == Layout::kChannelFirst ? (s.stride_n == 1 || p.seqlen <= 1)
                                           : (s.stride_d == 1 || head_dim <= 1);
}

// The kernels copy and store vectors of some width along the unit-stride dimension, starting
// at (b, h, token or d) offsets built from the other strides and at token offsets that are
// multiples of the tile size: a width needs a base pointer aligned to it and every other
// stride a multiple of width / elem_bytes elements (strides of size-1 dimensions never step,
// so they are not checked). Returns the first of `widths` (widest first) that holds for s,
// 0 if none does.
inline int vec_bytes(const Strided4& s, const FwdParams& p, int head_dim, int elem_bytes,
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

// One width serves q, k, v and out: the narrowest of the four.
inline int common_vec_bytes(const FwdParams& p, int elem_bytes, std::initializer_list<int> widths) {
  int w = vec_bytes(p.q, p, p.head_dim_qk, elem_bytes, widths);
  for (int x : {vec_bytes(p.k, p, p.head_dim_qk, elem_bytes, widths),
                vec_bytes(p.v, p, p.head_dim_v, elem_bytes, widths),
                vec_bytes(p.out, p, p.head_dim_v, elem_bytes, widths)}) {
    w = x < w ? x : w;
  }
  return w;
}

// Everything but the widths: an lse to write, a scale the kernels can use (the row max is
// taken on raw scores and scaled afterwards, which needs scale >= 0), sane sizes, unit strides.
inline bool params_ok(const FwdParams& p) {
  if (p.lse == nullptr) return false;
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale)) return false;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return false;
  return unit_stride_ok(p.q, p, p.head_dim_qk) && unit_stride_ok(p.k, p, p.head_dim_qk) &&
         unit_stride_ok(p.v, p, p.head_dim_v) && unit_stride_ok(p.out, p, p.head_dim_v);
}

}  // namespace fwd_dispatch
}  // namespace psa_fa2
