// The current device as the plan sees it (plan.h: DeviceDesc).
#pragma once

#include "plan.h"

namespace psa_fa2 {

// Compute capability, SM count, and whether the Hopper kernels may run: the build has sm_90a
// code, the device is compute capability 9.0 (sm_90a code runs there only), and the process
// did not start with PSA_FA2_DISABLE_SM90=1 (read once; it runs the mma.sync kernels that
// Ampere runs instead). Cached per device.
DeviceDesc current_device_desc();

// What setup.py built: its CUDA arch list (the one place that reads setup.py's
// PSA_FA2_CUDA_ARCHS), and whether that has sm_90a code (the wgmma kernels).
const char* built_cuda_archs();
bool built_sm90a_kernels();

}  // namespace psa_fa2
