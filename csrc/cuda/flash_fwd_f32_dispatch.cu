// Dispatch of the float32 forward (flash_fwd_f32_kernel.cuh): picks the instantiation for
// (dk, dv, layout, global access width, exact | tf32) and checks the kernel's assumptions.
// Anything not covered returns false from flash_fwd_f32_supported, and the caller falls back to
// reference_fwd.
#include <algorithm>
#include <cstdint>

#include "flash_fwd_f32_instances.h"
#include "fwd_dispatch_common.h"
#include "kv_split_scratch.h"
#include "launchers.h"
#include "sm90_device.h"

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

Launcher select(const FwdParams& p) {
  if (p.dtype != DType::kFloat32 || !fwd_dispatch::params_ok(p)) return nullptr;
  // 16 or 4 bytes: 4 or 1 floats.
  const int vec = fwd_dispatch::common_vec_bytes(p, 4, {16, 4});
  if (vec == 0) return nullptr;
  // TF32 where allowed and instantiated; else the exact kernel (more accurate than asked for).
  if (p.allow_tf32) {
    if (Launcher l = find_launcher(p, vec, true)) return l;
  }
  return find_launcher(p, vec, false);
}

}  // namespace

bool flash_fwd_f32_supported(const FwdParams& p) { return select(p) != nullptr; }

// Grids of fewer CTAs than SMs (1,4,400 is 16, with 8 warps each): as many CTAs per row tile
// as fit the SMs once over, each taking a run of the key tiles, up to one tile each and
// kMaxKvSplits. Both kernels, exact and TF32, take the split.
int flash_fwd_f32_kv_splits(const FwdParams& p) {
  if (select(p) == nullptr || !f32_kv_splits_enabled()) return 1;
  const int64_t row_tiles = (int64_t(p.seqlen) + kF32FwdRowsPerCta - 1) / kF32FwdRowsPerCta;
  const int64_t ctas = int64_t(p.batch) * p.heads * row_tiles;
  const int64_t sms = current_device_multiprocessors();
  // At most kF32FwdMaxKeysPerTile keys per tile: every split has a tile.
  const int64_t key_tiles =
      (int64_t(p.seqlen) + kF32FwdMaxKeysPerTile - 1) / kF32FwdMaxKeysPerTile;
  if (ctas == 0 || ctas >= sms) return 1;
  return int(std::min<int64_t>({sms / ctas, key_tiles, kMaxKvSplits}));
}

size_t flash_fwd_f32_split_scratch_bytes(const FwdParams& p, int kv_splits) {
  return size_t(KvSplitScratch(p, kv_splits).floats()) * sizeof(float);
}

void flash_fwd_f32(const FwdParams& p, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, stream);
}

}  // namespace psa_fa2
