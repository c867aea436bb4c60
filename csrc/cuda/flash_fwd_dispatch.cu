// Dispatch of the fast tensor-core forward: picks the instantiation for (dtype, dk, dv, layout,
// alignment) and checks the assumptions of flash_fwd_kernel.cuh. Anything not covered returns
// false from flash_fwd_supported, and the caller falls back to reference_fwd.
#include <cmath>
#include <cstdint>

#include "flash_fwd_instances.h"
#include "launchers.h"

namespace psa_fa2 {
namespace {

using Launcher = void (*)(const FwdParams&, cudaStream_t);

Launcher find_launcher(const FwdParams& p, bool aligned) {
#define PSA_FA2_MATCH(dt, dk, dv, lay, al)                                          \
  if (p.dtype == DType::dt && p.head_dim_qk == dk && p.head_dim_v == dv &&          \
      p.layout == Layout::lay && aligned == al)                                     \
    return &launch_flash_fwd<DType::dt, dk, dv, Layout::lay, al>;
  PSA_FA2_FLASH_FWD_INSTANCES(PSA_FA2_MATCH)
#undef PSA_FA2_MATCH
  return nullptr;
}

bool unit_stride_ok(const Strided4& s, const FwdParams& p, int head_dim) {
  return p.layout == Layout::kChannelFirst ? (s.stride_n == 1 || p.seqlen <= 1)
                                           : (s.stride_d == 1 || head_dim <= 1);
}

// The aligned kernels copy and store 16-byte chunks of 8 elements along the unit-stride
// dimension, starting at (b, h, token or d) offsets built from the other strides: the base
// pointer must be 16-byte aligned and every other stride a multiple of 8 elements. Strides of
// size-1 dimensions never step, so they are not checked.
bool chunk_aligned(const Strided4& s, const FwdParams& p, int head_dim) {
  const bool cf = p.layout == Layout::kChannelFirst;
  if (reinterpret_cast<uintptr_t>(s.ptr) % 16 != 0) return false;
  auto ok = [](int64_t stride, int extent) { return extent <= 1 || stride % 8 == 0; };
  return ok(s.stride_b, p.batch) && ok(s.stride_h, p.heads) &&
         (cf ? ok(s.stride_d, head_dim) : ok(s.stride_n, p.seqlen));
}

bool all_chunk_aligned(const FwdParams& p) {
  return chunk_aligned(p.q, p, p.head_dim_qk) && chunk_aligned(p.k, p, p.head_dim_qk) &&
         chunk_aligned(p.v, p, p.head_dim_v) && chunk_aligned(p.out, p, p.head_dim_v);
}

// The unaligned (channel-first) kernels access single elements: natural alignment suffices.
bool elem_aligned(const FwdParams& p) {
  for (const Strided4* s : {&p.q, &p.k, &p.v, &p.out}) {
    if (reinterpret_cast<uintptr_t>(s->ptr) % 2 != 0) return false;
  }
  return true;
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
  if (all_chunk_aligned(p)) return find_launcher(p, true);
  if (p.layout == Layout::kChannelFirst && elem_aligned(p)) return find_launcher(p, false);
  return nullptr;
}

}  // namespace

bool flash_fwd_supported(const FwdParams& p) { return select(p) != nullptr; }

void flash_fwd(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
