// Moving tiles between the op's tensors (any dtype, token-major or channel-first) and the
// fp32 buffers the tile math works on. Every conversion to fp32 happens here, one tile at a
// time; fp32 K and V tiles are read in place where their strides allow (float_tile).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace psa_fa2 {
namespace cpu {

// One (batch, head) of a logical [B, H, N, D] tensor: element (n, d) is ptr[n * sn + d * sd].
template <typename T>
struct HeadView {
  T* ptr;
  int64_t sn, sd;
  T& at(int64_t n, int64_t d) const { return ptr[n * sn + d * sd]; }
};

template <typename T>
HeadView<T> head_view(const at::Tensor& t, int64_t b, int64_t h) {
  // T may be const: data_ptr() is void*, and a const view of a tensor is the common case.
  return {static_cast<T*>(t.data_ptr()) + b * t.stride(0) + h * t.stride(1), t.stride(2),
          t.stride(3)};
}

// A tile of rows [n0, n0 + rows) of one head as fp32, addressed like HeadView (the gemm's A).
struct FloatTile {
  const float* ptr;
  int64_t sn, sd;
};

// fp32 heads are read in place, unless the rows the gemms step through (the stride that is
// not 1) lie a multiple of 4 KB apart: every row of the tile then maps to the same L1 set and
// they evict each other while the gemm sweeps them (docs/cpu_kernels.md). Those tiles and the
// other dtypes are converted into buf (rows * depth floats), keeping the source's orientation
// so that the copy reads memory in order. (Copying every fp32 tile would cost the forward a
// pass over each K / V tile per query tile where in place costs nothing.)
template <typename T>
FloatTile float_tile(const HeadView<const T>& x, int64_t n0, int64_t rows, int64_t depth,
                     float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t row_stride = x.sn == 1 ? x.sd : x.sn;
    if ((row_stride * int64_t(sizeof(float))) % 4096 != 0) return {x.ptr + n0 * x.sn, x.sn, x.sd};
  }
  if (x.sn == 1) {  // channel-first: buf[d][n]
    for (int64_t d = 0; d < depth; ++d) {
      const T* src = x.ptr + n0 + d * x.sd;
      float* dst = buf + d * rows;
      for (int64_t n = 0; n < rows; ++n) dst[n] = static_cast<float>(src[n]);
    }
    return {buf, 1, rows};
  }
  for (int64_t n = 0; n < rows; ++n) {  // token-major: buf[n][d]
    const T* src = x.ptr + (n0 + n) * x.sn;
    float* dst = buf + n * depth;
    for (int64_t d = 0; d < depth; ++d) dst[d] = static_cast<float>(src[d * x.sd]);
  }
  return {buf, depth, 1};
}

// dst[d][r] = factor * x(n0 + r, d) for r < rows, 0 for rows <= r < ld: a tile's rows as the
// columns of a row-major [depth][ld] buffer (the gemm's B).
template <typename T>
void pack_transposed(const HeadView<const T>& x, int64_t n0, int64_t rows, int64_t depth,
                     float factor, float* dst, int64_t ld) {
  for (int64_t d = 0; d < depth; ++d) {
    float* out = dst + d * ld;
    for (int64_t r = 0; r < rows; ++r) out[r] = factor * static_cast<float>(x.at(n0 + r, d));
    std::memset(out + rows, 0, (ld - rows) * sizeof(float));
  }
}

// dst[r][d] = x(n0 + r, d) for r < rows and d < depth, 0 for depth <= d < ld.
template <typename T>
void pack_rows(const HeadView<const T>& x, int64_t n0, int64_t rows, int64_t depth, float* dst,
               int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * ld;
    for (int64_t d = 0; d < depth; ++d) out[d] = static_cast<float>(x.at(n0 + r, d));
    std::memset(out + depth, 0, (ld - depth) * sizeof(float));
  }
}

// y(n0 + r, d) = factor * src[r * src_sr + d * src_sd] (+ y when accumulate), for r < rows and
// d < depth: an fp32 buffer of rows (src_sd = 1) or of columns (src_sr = 1) written back into
// a head of any layout and dtype, in the order of y's memory.
template <typename T>
void store_tile(const float* src, int64_t src_sr, int64_t src_sd, int64_t rows, int64_t depth,
                float factor, const HeadView<T>& y, int64_t n0, bool accumulate) {
  auto put = [&](int64_t r, int64_t d) {
    float value = factor * src[r * src_sr + d * src_sd];
    T& out = y.at(n0 + r, d);
    if (accumulate) value += static_cast<float>(out);
    out = static_cast<T>(value);
  };
  if (y.sn == 1) {
    for (int64_t d = 0; d < depth; ++d)
      for (int64_t r = 0; r < rows; ++r) put(r, d);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < depth; ++d) put(r, d);
  }
}

}  // namespace cpu
}  // namespace psa_fa2
