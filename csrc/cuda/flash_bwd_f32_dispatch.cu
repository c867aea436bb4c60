// Dispatch of the float32 backward (flash_bwd_f32_kernel.cuh): the instantiation for (dk, dv,
// layout), and how many CTAs share a key tile. Anything not covered returns false from
// flash_bwd_f32_supported, and the caller runs the blockwise backward instead.
#include <algorithm>

#include "flash_bwd_f32_instances.h"
#include "launchers.h"
#include "sm90_device.h"

namespace psa_fa2 {

namespace {

using Launcher = void (*)(const BwdParams&, int, cudaStream_t);

Launcher select(const BwdParams& p) {
  if (p.dtype != DType::kFloat32 || p.head_dim_qk != 32 || p.head_dim_v != 64) return nullptr;
  return p.layout == Layout::kChannelFirst ? &launch_flash_bwd_f32<32, 64, Layout::kChannelFirst>
                                           : &launch_flash_bwd_f32<32, 64, Layout::kTokenMajor>;
}

}  // namespace

bool flash_bwd_f32_supported(const BwdParams& p) { return select(p) != nullptr; }

// One CTA per 64-key tile unless that leaves SMs idle (1,4,400 is 28 tiles): then enough pieces
// of the query stream per tile for two CTAs per SM, each of at least two 32-row steps.
int flash_bwd_f32_row_pieces(const BwdParams& p) {
  const int64_t tiles = int64_t(p.batch) * p.heads * ((p.seqlen + 63) / 64);
  const int64_t sms = current_device_multiprocessors();
  if (tiles == 0 || tiles >= sms) return 1;
  const int64_t steps = (p.seqlen + 31) / 32;
  return int(std::clamp<int64_t>((2 * sms + tiles - 1) / tiles, 1, std::max<int64_t>(1, steps / 2)));
}

void flash_bwd_f32(const BwdParams& p, int pieces, cudaStream_t stream) {
  if (Launcher launch = select(p)) launch(p, pieces, stream);
}

}  // namespace psa_fa2
