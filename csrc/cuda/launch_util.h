// Host-side launch helpers shared by the fast kernels' launchers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

namespace psa_fa2 {

// Opting a kernel into more than 48 KB of dynamic shared memory is a driver call; at
// N = 400 a whole forward takes microseconds, so it is done once per kernel and device
// instead of on every launch. The kernel is a template argument so that each kernel (not
// each kernel signature) has its own flags.
template <auto kKernel>
inline void allow_dynamic_smem_once(size_t bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices];
  int device = 0;
  cudaGetDevice(&device);
  if (device < kMaxDevices && done[device].load(std::memory_order_acquire)) return;
  cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (device < kMaxDevices) done[device].store(true, std::memory_order_release);
}

}  // namespace psa_fa2
