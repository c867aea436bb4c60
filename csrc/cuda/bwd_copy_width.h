// The global copy width of the fast backward kernels for channel-first tensors: host-only, so
// the dispatcher (which picks the Hopper instantiation by it) needs no kernel code.
#pragma once

#include <cstdint>

#include "attention_params.h"

namespace psa_fa2 {
namespace fbwd {

// Largest power of two (<= 16 bytes) dividing every channel-first base pointer and every
// stride that moves between chunks (batch, head, channel): the copy width load_tile and
// store_tile may use. Token-major inputs are required to be 16-byte aligned outright.
inline int channel_first_granularity(const BwdParams& p) {
  int gran = 16;
  auto fold = [&](uint64_t bytes) {
    while (gran > 2 && bytes % gran != 0) gran /= 2;
  };
  const Strided4* all[] = {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv};
  for (const Strided4* s : all) {
    fold(reinterpret_cast<uintptr_t>(s->ptr));
    if (p.batch > 1) fold(uint64_t(s->stride_b) * 2);
    if (p.heads > 1) fold(uint64_t(s->stride_h) * 2);
    fold(uint64_t(s->stride_d) * 2);
  }
  return gran;
}

}  // namespace fbwd
}  // namespace psa_fa2
