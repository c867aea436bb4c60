// The fused CPU forward (fused_attention.h). A task is one tile of kQueryTile queries of one
// (batch, head); it walks the keys in tiles of kKeyTile with the online softmax:
//   S^T = K_j (scale log2(e) Q_i)^T        [keys][queries], log2 units
//   m, l, P^T = online softmax of S^T over its rows (tile_math.h)
//   O^T = alpha O^T + V_j^T P^T             [dv][queries]
// and writes out = O / l and lse = (m + log2 l) ln 2 once at the end.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fused_attention.h"
#include "tile_io.h"
#include "tile_math.h"

namespace psa_fa2 {
namespace cpu {
namespace {

// 128 queries x 128 keys: the score tile (64 KB) and the query and output columns
// ((dk + dv) x 128 floats) sit in a 512 KB L2 beside the key tile; smaller query tiles
// re-read every key more often, larger ones leave a 2-core machine idle at N = 400.
constexpr int64_t kQueryTile = 128;
constexpr int64_t kKeyTile = 128;

template <typename T>
void fwd_typed(const AttnShape& s, const at::Tensor& q_t, const at::Tensor& k_t,
               const at::Tensor& v_t, double scale, at::Tensor& out_t, at::Tensor& lse_t) {
  const int64_t N = s.seqlen, dk = s.head_dim_qk, dv = s.head_dim_v;
  // Tiles of equal size (to a column block), not kQueryTile and a ragged rest: at N = 400,
  // 4 x 112 rather than 3 x 128 and a last tile of 16 queries that costs as much as one of 128.
  const int64_t tiles = (N + kQueryTile - 1) / kQueryTile;
  const int64_t tile_rows = round_up_cols((N + tiles - 1) / tiles);
  const int64_t key_tiles = (N + kKeyTile - 1) / kKeyTile;
  const int64_t key_rows = (N + key_tiles - 1) / key_tiles;
  const int64_t tasks = s.batch * s.heads * tiles;
  const float q_factor = static_cast<float>(scale) * kLog2e;
  float* lse_all = lse_t.data_ptr<float>();
  const TileMath& tm = tile_math();

  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qt(dk * kQueryTile), ot(dv * kQueryTile), st(kKeyTile * kQueryTile);
    std::vector<float> m(kQueryTile), l(kQueryTile), alpha(kQueryTile);
    std::vector<float> kbuf(kKeyTile * dk), vbuf(kKeyTile * dv);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / tiles, r0 = (task % tiles) * tile_rows;
      if (r0 >= N) continue;  // rounding tile_rows up can leave a last tile empty
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const int64_t rows = std::min(tile_rows, N - r0), cols = round_up_cols(rows);
      const auto q = head_view<const T>(q_t, b, h), k = head_view<const T>(k_t, b, h),
                 v = head_view<const T>(v_t, b, h);
      pack_transposed(q, r0, rows, dk, q_factor, qt.data(), cols);
      std::fill_n(ot.begin(), dv * cols, 0.f);
      std::fill_n(m.begin(), cols, -std::numeric_limits<float>::infinity());
      std::fill_n(l.begin(), cols, 0.f);
      for (int64_t j0 = 0; j0 < N; j0 += key_rows) {
        const int64_t nk = std::min(key_rows, N - j0);
        const FloatTile kj = float_tile(k, j0, nk, dk, kbuf.data());
        const FloatTile vj = float_tile(v, j0, nk, dv, vbuf.data());
        tm.gemm_tile(nk, cols, dk, kj.ptr, kj.sn, kj.sd, qt.data(), cols, st.data(), cols, false);
        tm.softmax_update(nk, cols, st.data(), m.data(), l.data(), alpha.data());
        if (j0 > 0) tm.scale_columns(dv, cols, ot.data(), alpha.data());
        tm.gemm_tile(dv, cols, nk, vj.ptr, vj.sd, vj.sn, st.data(), cols, ot.data(), cols, true);
      }
      // out = O / l. A row with l = 0 (only -inf scores) gives 0 / 0 = NaN, as eager does.
      for (int64_t r = 0; r < rows; ++r) alpha[r] = 1.f / l[r];
      for (int64_t r = rows; r < cols; ++r) alpha[r] = 0.f;
      tm.scale_columns(dv, cols, ot.data(), alpha.data());
      store_tile(ot.data(), 1, cols, rows, dv, 1.f, head_view<T>(out_t, b, h), r0, false);
      float* lse = lse_all + bh * N + r0;
      for (int64_t r = 0; r < rows; ++r) lse[r] = (m[r] + std::log2(l[r])) * kLn2;
    }
  });
}

}  // namespace

void fused_fwd(const AttnShape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               double scale, at::Tensor& out, at::Tensor& lse) {
  switch (q.scalar_type()) {
    case at::kFloat: return fwd_typed<float>(s, q, k, v, scale, out, lse);
    case at::kBFloat16: return fwd_typed<at::BFloat16>(s, q, k, v, scale, out, lse);
    case at::kHalf: return fwd_typed<at::Half>(s, q, k, v, scale, out, lse);
    default: TORCH_CHECK(false, "fused CPU attention takes float32, bfloat16 or float16, got ",
                         q.scalar_type());
  }
}

}  // namespace cpu
}  // namespace psa_fa2
