#include "device_desc.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace psa_fa2 {
namespace {

bool sm90_disabled_by_environment() {
  static const bool disabled = [] {
    const char* value = std::getenv("PSA_FA2_DISABLE_SM90");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return disabled;
}

DeviceDesc query(int device) {
  DeviceDesc d;
  cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&d.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaGetLastError();  // a failed query leaves zeros, and no sticky error
  d.sm90_kernels = built_sm90a_kernels() && d.major == 9 && d.minor == 0 &&
                   !sm90_disabled_by_environment();
  return d;
}

}  // namespace

const char* built_cuda_archs() { return PSA_FA2_CUDA_ARCHS; }

bool built_sm90a_kernels() {
#if defined(PSA_FA2_WITH_SM90A)
  return true;
#else
  return false;
#endif
}

DeviceDesc current_device_desc() {
  constexpr int kMaxDevices = 64;
  static DeviceDesc cached[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  if (device >= kMaxDevices) return query(device);
  std::call_once(once[device], [device] { cached[device] = query(device); });
  return cached[device];
}

}  // namespace psa_fa2
