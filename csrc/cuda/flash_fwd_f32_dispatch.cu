// Dispatch of the float32 forward (flash_fwd_f32_kernel.cuh): picks the instantiation for
// (dk, dv, layout, global access width, exact | tf32) and checks the kernel's assumptions.
// Anything not covered returns false from flash_fwd_f32_supported, and the caller falls back to
// reference_fwd.
#include <cmath>
#include <cstdint>

#include "flash_fwd_f32_instances.h"
#include "launchers.h"

namespace psa_fa2 {

namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

Launcher find_launcher(const FwdParams& p, int vec_bytes, bool tf32) {
#define PSA_FA2_MATCH(dk, dv, lay, vec, tf)                                          \
  if (p.head_dim_qk == dk && p.head_dim_v == dv && p.layout == Layout::lay &&        \
      vec_bytes == vec && tf32 == tf)                                                \
    return &launch_flash_fwd_f32<dk, dv, Layout::lay, vec, tf>;
  PSA_FA2_FLASH_FWD_F32_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
}

bool unit_stride_ok(const Strided4& s, const FwdParams& p, int head_dim) {
  return p.layout == Layout::kChannelFirst ? (s.stride_n == 1 || p.seqlen <= 1)
                                           : (s.stride_d == 1 || head_dim <= 1);
}

// The kernel copies and stores vectors of 16 or 4 bytes (4 or 1 floats) along the unit-stride
// dimension, from (b, h, token or channel) offsets built from the other strides, at token offsets
// that are multiples of 32: 16 bytes needs a 16-byte aligned base pointer and every other stride a
// multiple of 4 elements (strides of size-1 dimensions never step and are not checked). Returns
// the widest width that holds for s, 0 for a pointer that is not even 4-byte aligned.
int vec_bytes(const Strided4& s, const FwdParams& p, int head_dim) {
  const bool cf = p.layout == Layout::kChannelFirst;
  for (int bytes : {16, 4}) {
    const int64_t elems = bytes / 4;
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
  if (p.dtype != DType::kFloat32 || p.lse == nullptr) return nullptr;
  // The row max is taken on raw scores and scaled afterwards, which needs scale >= 0.
  if (!(p.scale >= 0.0) || !std::isfinite(p.scale)) return nullptr;
  if (p.batch < 0 || p.heads < 0 || p.seqlen < 0) return nullptr;
  if (!unit_stride_ok(p.q, p, p.head_dim_qk) || !unit_stride_ok(p.k, p, p.head_dim_qk) ||
      !unit_stride_ok(p.v, p, p.head_dim_v) || !unit_stride_ok(p.out, p, p.head_dim_v)) {
    return nullptr;
  }
  const int vec = common_vec_bytes(p);
  if (vec == 0) return nullptr;
  // TF32 where allowed and instantiated; else the exact kernel (more accurate than asked for).
  if (p.allow_tf32) {
    if (Launcher l = find_launcher(p, vec, true)) return l;
  }
  return find_launcher(p, vec, false);
}

}  // namespace

bool flash_fwd_f32_supported(const FwdParams& p) { return select(p) != nullptr; }

void flash_fwd_f32(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
