#include "sm90_device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace psa_fa2 {
namespace {

bool on_sm90a_device() {
#if defined(PSA_FA2_WITH_SM90A)
  constexpr int kMaxDevices = 64;
  static signed char cached[kMaxDevices];  // 0 unknown, 1 yes, -1 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < kMaxDevices && cached[device] != 0) return cached[device] > 0;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const bool yes = major == 9 && minor == 0;
  if (device < kMaxDevices) cached[device] = yes ? 1 : -1;
  return yes;
#else
  return false;
#endif
}

// True when the environment variable `name` is exactly "1".
bool env_flag_set(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

int current_device_multiprocessors() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not read yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < kMaxDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (device < kMaxDevices) cached[device].store(count, std::memory_order_relaxed);
  return count;
}

bool sm90_kernels_enabled() { return !env_flag_set("PSA_FA2_DISABLE_SM90") && on_sm90a_device(); }

bool aligned_row_copies_enabled() { return !env_flag_set("PSA_FA2_DISABLE_ALIGNED_COPIES"); }

bool f32_kv_splits_enabled() { return !env_flag_set("PSA_FA2_DISABLE_F32_KV_SPLITS"); }

KVTileImagesChoice kv_tile_images_choice() {
  const char* value = std::getenv("PSA_FA2_KV_TILE_IMAGES");
  if (value == nullptr) return {CopyChoice::kMeasured, 0};
  if (std::strcmp(value, "1") == 0) return {CopyChoice::kAlways, 0};
  if (std::strcmp(value, "2") == 0) return {CopyChoice::kAlways, 2};
  if (std::strcmp(value, "3") == 0) return {CopyChoice::kAlways, 3};
  if (std::strcmp(value, "0") == 0) return {CopyChoice::kNever, 0};
  return {CopyChoice::kMeasured, 0};
}

CopyChoice stream_tile_images_choice() {
  const char* value = std::getenv("PSA_FA2_BWD_STREAM_IMAGES");
  if (value == nullptr) return CopyChoice::kMeasured;
  if (std::strcmp(value, "1") == 0) return CopyChoice::kAlways;
  if (std::strcmp(value, "0") == 0) return CopyChoice::kNever;
  return CopyChoice::kMeasured;
}

}  // namespace psa_fa2
