// Host-side launch helpers shared by the fast kernels' launchers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

namespace psa_fa2 {

// Opting a kernel into more than 48 KB of dynamic shared memory is a driver call, and a short
// forward takes only microseconds, so it is done once per kernel and device
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

// Grid of the row-tile kernels: (ceil(N / rows_per_cta), B * H). B * H fits the grid's y
// dimension because launch.cpp launches larger calls in pieces (grid_chunks.h).
inline dim3 row_tile_grid(int seqlen, int rows_per_cta, int batch_heads) {
  return dim3((seqlen + rows_per_cta - 1) / rows_per_cta, batch_heads);
}

// The softmax scale with log2(e) folded in: the kernels' exponentials are base 2.
inline float softmax_scale_log2(double scale) { return static_cast<float>(scale * 1.4426950408889634); }

}  // namespace psa_fa2
