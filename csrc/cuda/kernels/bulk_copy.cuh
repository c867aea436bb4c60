// Hopper (sm_90) bulk asynchronous copies from global to shared memory, completed through
// mbarriers: one thread starts the copy of a whole contiguous block, and the threads that read
// it wait on the barrier's phase. Only what the Hopper kernels need for the forward's K / V tile
// images (fwd_sm90.cuh) and the backward's stream images (bwd_sm90.cuh), both made by
// copy_rows.cu's tiled mode; callers must only use these on sm_90 or later.
//
// A barrier that copies complete expects one arrival per phase (the copying thread's
// arrive.expect_tx) plus the bytes of that phase's copies; phase k completes when both are in.
// One that counts threads (arrive) completes a phase when its count of arrivals is in.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace psa_fa2 {
namespace bulk_copy {

// One 8-byte mbarrier at `bar` (shared-state-space address) expecting `arrivals` arrivals per
// phase. The initialising thread must then fence_barrier_init() and the CTA pass a barrier
// before any thread uses it.
__device__ __forceinline__ void init_barrier(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// One arrival on `bar` (with no bytes to wait for: a barrier that counts threads), ordered
// after this thread's earlier memory accesses (release, the default semantics).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once, as above.
__device__ __forceinline__ void arrive(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy that completes the copies.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives on `bar` and declares `bytes` more for its current phase, then copies `bytes` (a
// multiple of 16; both addresses 16-byte aligned) from src to dst, which complete the phase.
__device__ __forceinline__ void copy_block(uint32_t dst, const void* src, uint32_t bytes,
                                           uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
  // The CTA's own shared memory is a valid ::cluster address (a CTA is a cluster of one).
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Waits until the phase of `bar` with the given parity (0 for its phases 0, 2, ...; 1 for
// 1, 3, ...) has completed; the copied bytes are then visible to this thread and to the wgmmas
// it issues.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace bulk_copy
}  // namespace psa_fa2
