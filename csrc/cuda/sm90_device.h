// Whether the Hopper (sm_90a) kernels of this build may run on the current device; shared by
// the forward and backward dispatchers (one switch for both).
#pragma once

namespace psa_fa2 {

// The build has sm_90a code (PSA_FA2_WITH_SM90A, set by setup.py), the current device has
// compute capability 9.0 (every Hopper GPU; sm_90a code runs there only) and the environment
// does not set PSA_FA2_DISABLE_SM90=1. The variable is read on every call, so a process may
// switch between the Hopper kernels and the mma.sync ones that Ampere runs.
bool sm90_kernels_enabled();

// Whether the Hopper kernels' callers may copy narrow or misaligned channel-first rows to
// 128-byte aligned ones first (aligned_rows.h; the results are the same either way):
// PSA_FA2_DISABLE_ALIGNED_COPIES=1 turns that off (benchmarks of the copies), read per call.
bool aligned_row_copies_enabled();

// Whether the fp32 forward may share a row tile's keys among CTAs on small grids
// (FwdParams::kv_splits; the results agree to rounding): PSA_FA2_DISABLE_F32_KV_SPLITS=1 turns
// that off (benchmarks of the splits), read per call.
bool f32_kv_splits_enabled();

// PSA_FA2_KV_TILE_IMAGES, read per call: 1 copies K and V to tile images wherever the forward
// can read them (kAlways), 0 never (kNever); unset or anything else, where the dispatch's
// measured threshold says (kMeasured; flash_fwd_wants_kv_tile_images). 2 and 3 are 1 with the
// image kernel's CTAs of that many warpgroups (warpgroups; 0: the dispatch picks them).
// PSA_FA2_DISABLE_ALIGNED_COPIES=1 turns these copies off as well.
enum class CopyChoice { kMeasured, kAlways, kNever };
struct KVTileImagesChoice {
  CopyChoice copy;
  int warpgroups;
};
KVTileImagesChoice kv_tile_images_choice();

// PSA_FA2_BWD_STREAM_IMAGES, read per call: 1 copies Q and dO to the wgmma backward's stream
// images wherever it can read them (kAlways), 0 never (kNever); unset or anything else, where the
// dispatch's threshold says (flash_bwd_wants_stream_tile_images).
// PSA_FA2_DISABLE_ALIGNED_COPIES=1 turns these copies off as well.
CopyChoice stream_tile_images_choice();

// Streaming multiprocessors of the current device (cached per device; 0 if it cannot be read).
int current_device_multiprocessors();

}  // namespace psa_fa2
