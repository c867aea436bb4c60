// The global copy width of the fast backward kernels for channel-first tensors: host-only, so
// the dispatcher (which picks the Hopper instantiation by it) needs no kernel code.
#pragma once

#include <cstdint>

#include "../attention_params.h"

namespace psa_fa2 {
namespace fbwd {

// Largest power of two (<= 16 bytes) dividing every channel-first base pointer and every
// stride that moves between chunks (batch, head, channel): the copy width load_tile and
// store_tile may use. Token-major inputs are required to be 16-byte aligned outright.
// The same over the given tensors only, up to max_bytes.
template <int kCount>
inline int granularity_of(const BwdParams& p, const Strided4* const (&tensors)[kCount],
                          int max_bytes = 16) {
  int gran = max_bytes;
  auto fold = [&](uint64_t bytes) {
    while (gran > 2 && bytes % gran != 0) gran /= 2;
  };
  for (const Strided4* s : tensors) {
    fold(reinterpret_cast<uintptr_t>(s->ptr));
    if (p.batch > 1) fold(uint64_t(s->stride_b) * 2);
    if (p.heads > 1) fold(uint64_t(s->stride_h) * 2);
    fold(uint64_t(s->stride_d) * 2);
  }
  return gran;
}

inline int channel_first_granularity(const BwdParams& p) {
  const Strided4* const all[] = {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv};
  return granularity_of(p, all);
}

// The copy width of the tensors the wgmma backward streams, Q and dO, which every CTA reads
// whole (the others are read or written once per tile).
inline int stream_granularity(const BwdParams& p) {
  const Strided4* const streamed[] = {&p.q, &p.dout};
  return granularity_of(p, streamed);
}

}  // namespace fbwd
}  // namespace psa_fa2
