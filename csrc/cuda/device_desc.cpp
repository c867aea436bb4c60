#include "device_desc.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "../build_facts.h"

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

// Whether the arch list names 9.0a (alone or as 9.0a+PTX): nvcc then made the wgmma kernels'
// sm_90a code, the only code of theirs with a body.
bool built_sm90a_kernels() {
  static const bool built = [] {
    const std::string archs = built_cuda_archs();
    size_t begin = 0;
    while (begin <= archs.size()) {
      const size_t end = std::min(archs.find_first_of("; ", begin), archs.size());
      const std::string arch = archs.substr(begin, end - begin);
      if (arch.substr(0, arch.find('+')) == "9.0a") return true;
      begin = end + 1;
    }
    return false;
  }();
  return built;
}

BuildFacts build_facts() {
  BuildFacts facts;
  facts.cuda = true;
  facts.cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string((CUDART_VERSION % 1000) / 10);
  facts.cuda_archs = built_cuda_archs();
  facts.cuda_kernels = {"reference", "mma.sync", "ffma", "tf32"};
  if (built_sm90a_kernels()) facts.cuda_kernels.push_back("wgmma");
  return facts;
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
