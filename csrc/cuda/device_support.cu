#include "device_support.h"

#include <cuda_runtime.h>

#include <atomic>

namespace psa_fa2 {
namespace {

// Built for the same archs as every other kernel of the extension, so whether the runtime
// finds code of it for a device (SASS of the device's major version and a minor no higher
// than the device's, or PTX of an older or equal virtual arch, which the driver compiles) says
// the same of all of them.
__global__ void probe_kernel() {}

DeviceReport query(int device) {
  DeviceReport report{DeviceSupport::kNoDevice, 0, 0};
  if (cudaDeviceGetAttribute(&report.major, cudaDevAttrComputeCapabilityMajor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&report.minor, cudaDevAttrComputeCapabilityMinor, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return report;
  }
  if (report.major < 8) {
    report.support = DeviceSupport::kTooOld;
    return report;
  }
  cudaFuncAttributes attributes;
  const cudaError_t found = cudaFuncGetAttributes(&attributes, probe_kernel);
  // Not a sticky error: clear it, so that a caller who catches ours finds the runtime clean.
  if (found != cudaSuccess) cudaGetLastError();
  report.support = found == cudaSuccess ? DeviceSupport::kSupported : DeviceSupport::kNotBuiltFor;
  return report;
}

}  // namespace

DeviceReport current_device_support() {
  constexpr int kMaxDevices = 64;
  // Only a device found supported is remembered, so that an unsupported one raises the same
  // error on every call.
  static std::atomic<bool> supported[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {DeviceSupport::kNoDevice, 0, 0};
  }
  if (device < kMaxDevices && supported[device].load(std::memory_order_relaxed))
    return {DeviceSupport::kSupported, 0, 0};
  const DeviceReport report = query(device);
  if (report.support == DeviceSupport::kSupported && device < kMaxDevices)
    supported[device].store(true, std::memory_order_relaxed);
  return report;
}

}  // namespace psa_fa2
