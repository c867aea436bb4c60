// Dispatch of the fast tensor-core forward: picks the instantiation for (dtype, dk, dv, layout,
// global access width) and checks the assumptions of flash_fwd_kernel.cuh. Anything not covered returns
// false from flash_fwd_supported, and the caller falls back to reference_fwd.
#include <cmath>
#include <cstdint>

#include "flash_fwd_instances.h"
#include "launchers.h"

namespace psa_fa2 {
namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

Launcher find_launcher(const FwdParams& p, int vec_bytes) {
#define PSA_FA2_MATCH(dt, dk, dv, lay, vec)                                         \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && vec_bytes == vec)                                  \
    return &launch_flash_fwd<DType::dt, dk, dv, Layout::lay, vec>;
  PSA_FA2_FLASH_FWD_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
}

bool unit_stride_ok(const Strided4& s, const FwdParams& p, int head_dim) {
  return p.layout == Layout::kChannelFirst ? (s.stride_n == 1 || p.seqlen <= 1)
                                           : (s.stride_d == 1 || head_dim <= 1);
}

// The kernels copy and store vectors of kVecBytes = 16, 8, 4 or 2 bytes (8, 4, 2 or 1 elements)
// along the unit-stride dimension, starting at (b, h, token or d) offsets built from the other
// strides, at token offsets that are multiples of 64: the base pointer must be kVecBytes-aligned
// and every other stride a multiple of kVecBytes / 2 elements. Strides of size-1 dimensions never
// step, so they are not checked. Returns the widest width that holds for s, 0 if none does (an
// odd pointer).
int vec_bytes(const Strided4& s, const FwdParams& p, int head_dim) {
  const bool cf = p.layout == Layout::kChannelFirst;
  for (int bytes = 16; bytes >= 2; bytes /= 2) {
    const int64_t elems = bytes / 2;
    auto ok = [elems](int64_t stride, int extent) { return extent <= 1 || stride % elems == 0; };
    if (reinterpret_cast<uintptr_t>(s.ptr) % bytes == 0 && ok(s.stride_b, p.batch) &&
        ok(s.stride_h, p.heads) && (cf ? ok(s.stride_d, head_dim) : ok(s.stride_n, p.seqlen))) {
      return bytes;
    }
  }
  return 0;
}

// One width serves q, k, v and out: the narrowest of the four.
int common_vec_bytes(const FwdParams& p) {
  int w = vec_bytes(p.q, p, p.head_dim_qk);
  for (int x : {vec_bytes(p.k, p, p.head_dim_qk), vec_bytes(p.v, p, p.head_dim_v),
                vec_bytes(p.out, p, p.head_dim_v)}) {
    w = x < w ? x : w;
  }
  return w;
}

Launcher select(const FwdParams& p) {
  if (p.lse == nullptr) return nullptr;
  // The row max is taken on raw scores and scaled afterwards, which needs scale >= 0.
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale)) return nullptr;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return nullptr;
  if (!unit_stride_ok(p.q, p, p.head_dim_qk) || !unit_stride_ok(p.k, p, p.head_dim_qk) ||
      !unit_stride_ok(p.v, p, p.head_dim_v) || !unit_stride_ok(p.out, p, p.head_dim_v)) {
    return nullptr;
  }
  const int vec = common_vec_bytes(p);
  // Token-major instantiations exist for 16-byte rows only; channel-first for every width >= 2
  // (16: "cf"; 8, 4 and 2: "cfu", see generate_flash_fwd.py).
  if (vec == 16 || (p.layout == Layout::kChannelFirst && vec >= 2)) return find_launcher(p, vec);
  return nullptr;
}

}  // namespace

bool flash_fwd_supported(const FwdParams& p) { return select(p) != nullptr; }

void flash_fwd(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
