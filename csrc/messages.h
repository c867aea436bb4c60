// Pieces of the error messages: every message names the argument, what was expected and what
// came.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace psa_fa2 {

// Messages are built from strings only: streaming integers into an ostream from this
// library crashed on one torch build (a libstdc++ mismatch in ostream's number
// formatting), and an error path must never crash.
inline std::string str(int64_t x) { return std::to_string(x); }

inline std::string str(at::IntArrayRef xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + std::to_string(xs[i]);
  return out + "]";
}

inline std::string str(const at::Device& d) { return d.str(); }

inline std::string describe(const at::Tensor& t) {
  return "shape " + str(t.sizes()) + " strides " + str(t.strides()) + " dtype " +
         c10::toString(t.scalar_type()) + " on " + str(t.device());
}

}  // namespace psa_fa2
