// The current device as the plan sees it (plan.h: DeviceDesc).
#pragma once

#include "plan.h"

namespace psa_fa2 {

// Compute capability, SM count, and whether the Hopper kernels may run: the build has sm_90a
// code, the device is compute capability 9.0 (sm_90a code runs there only), and the process
// did not start with PSA_FA2_DISABLE_SM90=1 (read once; it runs the mma.sync kernels that
// Ampere runs instead). Cached per device.
DeviceDesc current_device_desc();

}  // namespace psa_fa2
