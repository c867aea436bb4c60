// Whether the current device can run this build's kernels, so that the ops can raise an error
// that names the GPU and the archs built before they launch anything there.
#pragma once

namespace psa_fa2 {

enum class DeviceSupport {
  kSupported,
  kTooOld,       // compute capability below 8.0: the kernels' tensor-core paths need sm_80
  kNotBuiltFor,  // none of the archs built (PSA_FA2_CUDA_ARCHS) has code this device runs
  kNoDevice,     // the CUDA runtime could not report on the current device
};

struct DeviceReport {
  DeviceSupport support;
  int major, minor;  // the device's compute capability, where it is not kSupported
};

// For the current device; the answer is cached per device (it cannot change in a process).
DeviceReport current_device_support();

}  // namespace psa_fa2
