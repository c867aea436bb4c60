// The one place that decides what a call runs: plan_fwd and plan_bwd are pure functions of the
// call (dtype, head dims, layout, sizes, strides and pointer alignment, TF32 rule, determinism)
// and of a device description. They return everything the call will do: the kernel family and
// instance, the copies to make first, and the work splits. launch.cpp only carries a plan out.
//
// Plain C++ (no CUDA, no torch), so it compiles in every build: `python -m psa_fa2_ext --plan`
// prints plans for any device description, and tests/test_plan.py pins them.
#pragma once

#include <cstddef>
#include <string>

#include "attention_params.h"
#include "kernels/bwd_tail_split.h"

namespace psa_fa2 {

// What the plan needs to know of the GPU.
struct DeviceDesc {
  int major = 0, minor = 0;   // compute capability
  int multiprocessors = 0;
  int smem_per_block = 0;     // shared memory a CTA may opt in to (0: unknown, not checked)
  bool sm90_kernels = false;  // the build has sm_90a code, the device is compute capability 9.0,
                              // and PSA_FA2_DISABLE_SM90 is not set
  // The device runs this build's kernels: compute capability 8.0 or newer, and code for it in
  // the build (SASS of its major version, or PTX it can compile). Where not, every call runs
  // blockwise on at::matmul (torch's own kernels), which every GPU torch supports can run.
  bool runs_kernels = true;
};

// Tests only (psa_fa2_ext._testing.force): run paths the plan would not pick by itself.
enum class Choice : int { kAuto = 0, kNever, kAlways };
struct PlanOverrides {
  bool no_sm90 = false;          // plan as if the wgmma kernels did not exist
  bool no_copies = false;        // no aligned-row, tile-image or stream-image copies
  bool no_f32_kv_splits = false; // fp32 forward: one CTA per row tile
  Choice kv_images = Choice::kAuto;  // forward: K / V tile images
  int kv_image_warpgroups = 0;       // 2 or 3 with kv_images kAlways; 0: the plan picks
  Choice stream_images = Choice::kAuto;  // backward: Q / dO stream images
  bool as_if_no_kernels = false;  // plan as on a GPU that runs none of this build's kernels
  int smem_per_block = 0;         // plan as on a GPU with this much shared memory per CTA
};


// Why a call runs no fast kernel: none is compiled for it (the reference kernel runs), the
// GPU runs none of this build's kernels, or the one that would run needs more shared memory
// per CTA than the GPU has (both: blockwise on at::matmul).
enum class Fallback : int { kNone = 0, kNoInstance, kDeviceRunsNoKernels, kSharedMemory };

// The copies a call makes before its kernels run (aligned_rows.h makes them).
enum class FwdCopy : int { kNone = 0, kAlignedKV, kKVTileImages };
enum class BwdCopy : int { kNone = 0, kAlignedQdO, kQdOStreamImages };

struct FwdPlan {
  FwdKernel kernel = FwdKernel::kReference;
  int instance = -1;  // index into kFwdInstances (instances/registry.h); -1 for the reference
                      // and blockwise paths
  FwdCopy copy = FwdCopy::kNone;
  int kv_splits = 1;  // fp32 kernels: CTAs sharing each row tile (FwdParams::kv_splits)
  Fallback fallback = Fallback::kNone;  // where impl auto / fast wanted a fast kernel
};

struct BwdPlan {
  BwdKernel kernel = BwdKernel::kReference;
  int instance = -1;  // index into kBwdInstances; -1 for the reference and blockwise paths
  BwdSchedule schedule = BwdSchedule::kAtomicDQ;  // mma.sync kernel
  BwdCopy copy = BwdCopy::kNone;
  int f32_row_pieces = 1;  // FFMA kernel: CTAs sharing a key tile
  BwdTailSplit tail{};     // wgmma kernel: the last wave shared along the query stream
  size_t workspace_bytes = 0;  // fast kernels' scratch (dQ accumulators, tail sums)
  Fallback fallback = Fallback::kNone;
};

FwdPlan plan_fwd(const FwdParams& call, Impl impl, const DeviceDesc& device,
                 const PlanOverrides& overrides = {});
BwdPlan plan_bwd(const BwdParams& call, Impl impl, const DeviceDesc& device,
                 const PlanOverrides& overrides = {});

// One line each, e.g. "wgmma bf16 32x64 channel_first q/out 16B, K/V tile images (3 warpgroups)
// 16B; copy K/V to tile images".
std::string describe(const FwdPlan& plan);
std::string describe(const BwdPlan& plan);

}  // namespace psa_fa2
