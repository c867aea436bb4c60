// The fused CPU backward (fused_attention.h). A task owns a run of key tiles of one (batch,
// head); for each key tile it walks every query tile, recomputing the probabilities from lse:
//   S^T  = K_j (scale log2(e) Q_i)^T      P^T = exp2(S^T - lse2_i)        [keys][queries]
//   dP^T = V_j dO_i^T                     dS^T = P^T * (dP^T - D_i)
//   dV_j += P^T dO_i       dK_j += dS^T Q_i       (in the task's tile buffers)
//   dQ_i^T += K_j^T dS^T                          (in the task's own dq sums)
// dK and dV are finished with their key tile and written once. dQ sums over every key tile:
// each task adds into its own [dk][N] buffer, and a last pass adds the tasks' buffers into dq
// in a fixed order, so the result is the same on every run (no atomics, no races).
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "fused_attention.h"
#include "tile_io.h"
#include "tile_math.h"

namespace psa_fa2 {
namespace cpu {
namespace {

// 64 keys x 128 queries: the two score tiles (P^T and dS^T, 32 KB each), the query side of
// a tile (Q and dO, rows and columns: 96 KB at (32, 64)) and the key tile's gradients stay
// in L2 while the gemms sweep them.
constexpr int64_t kQueryTile = 128;
constexpr int64_t kKeyTile = 64;

// Tasks per head: 1 when the heads alone keep every thread busy; else the key tiles of a
// head are split over ceil(threads / heads) tasks, each with its own dq sums.
int64_t tasks_per_head(int64_t heads, int64_t key_tiles) {
  const int64_t threads = std::max<int64_t>(at::get_num_threads(), 1);
  return std::clamp<int64_t>((threads + heads - 1) / heads, 1, key_tiles);
}

template <typename T>
void bwd_typed(const AttnShape& s, const at::Tensor& dout_t, const at::Tensor& q_t,
               const at::Tensor& k_t, const at::Tensor& v_t, const at::Tensor& out_t,
               const at::Tensor& lse_t, double scale, at::Tensor& dq_t, at::Tensor& dk_t,
               at::Tensor& dv_t) {
  const int64_t N = s.seqlen, dk = s.head_dim_qk, dv = s.head_dim_v;
  const int64_t BH = s.batch * s.heads, H = s.heads;
  const int64_t n_pad = round_up_cols(N), dk_pad = round_up_cols(dk), dv_pad = round_up_cols(dv);
  const float q_factor = static_cast<float>(scale) * kLog2e;
  const TileMath& tm = tile_math();
  const auto fopts = q_t.options().dtype(at::kFloat);

  // Equal tiles rather than full ones and a ragged rest (fused_fwd.cpp).
  const int64_t query_tiles = (N + kQueryTile - 1) / kQueryTile;
  const int64_t query_rows = round_up_cols((N + query_tiles - 1) / query_tiles);
  const int64_t key_tiles = (N + kKeyTile - 1) / kKeyTile;
  const int64_t key_rows = (N + key_tiles - 1) / key_tiles;

  // Per query: lse in log2 units and D = rowsum(dO * O); zero past N, where the padded
  // columns of a last query tile then give P^T = 1 and dS^T = 0.
  at::Tensor stats = at::zeros({2, BH, n_pad}, fopts);
  float* lse2 = stats.data_ptr<float>();
  float* delta = lse2 + BH * n_pad;
  const float* lse = lse_t.data_ptr<float>();
  // The query side of every query tile, as the gemms read it, packed once rather than once
  // per key tile: the scaled Q^T [dk][cols] and dO^T [dv][cols] (B of the S^T and dP^T
  // products), Q [rows][dk_pad] and dO [rows][dv_pad] (B of dK and dV). That is twice the
  // size of q and dout in fp32, O(N) per head; packing per key tile instead took a fifth of
  // the backward's time.
  const int64_t qt_size = dk * query_rows, q_rows_size = query_rows * dk_pad;
  const int64_t dot_size = dv * query_rows, do_rows_size = query_rows * dv_pad;
  const int64_t packed_size = qt_size + q_rows_size + dot_size + do_rows_size;
  at::Tensor packed = at::empty({BH, query_tiles, packed_size}, fopts);
  float* packed_all = packed.data_ptr<float>();
  at::parallel_for(0, BH * query_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / query_tiles, b = bh / H, h = bh % H;
      const int64_t r0 = (task % query_tiles) * query_rows;
      const int64_t rows = std::max<int64_t>(std::min(query_rows, N - r0), 0);
      const int64_t cols = round_up_cols(rows);
      const auto q = head_view<const T>(q_t, b, h), o = head_view<const T>(out_t, b, h),
                 d_o = head_view<const T>(dout_t, b, h);
      float* qt = packed_all + task * packed_size;
      float* q_rows = qt + qt_size;
      float* dot = q_rows + q_rows_size;
      float* do_rows = dot + dot_size;
      pack_transposed(q, r0, rows, dk, q_factor, qt, cols);
      pack_rows(q, r0, rows, dk, q_rows, dk_pad);
      pack_transposed(d_o, r0, rows, dv, 1.f, dot, cols);
      pack_rows(d_o, r0, rows, dv, do_rows, dv_pad);
      for (int64_t r = 0; r < rows; ++r) {
        float sum = 0.f;
        for (int64_t c = 0; c < dv; ++c)
          sum += do_rows[r * dv_pad + c] * static_cast<float>(o.at(r0 + r, c));
        delta[bh * n_pad + r0 + r] = sum;
        lse2[bh * n_pad + r0 + r] = lse[bh * N + r0 + r] * kLog2e;
      }
    }
  });

  const int64_t parts = tasks_per_head(BH, key_tiles);
  at::Tensor dq_parts = at::zeros({BH, parts, dk, n_pad}, fopts);
  float* dq_part_all = dq_parts.data_ptr<float>();

  at::parallel_for(0, BH * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kbuf(kKeyTile * dk), vbuf(kKeyTile * dv);
    std::vector<float> dk_acc(kKeyTile * dk_pad), dv_acc(kKeyTile * dv_pad);
    std::vector<float> pt(kKeyTile * kQueryTile), dst(kKeyTile * kQueryTile);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / parts, part = task % parts;
      const int64_t b = bh / H, h = bh % H;
      const auto k = head_view<const T>(k_t, b, h), v = head_view<const T>(v_t, b, h);
      float* dq_part = dq_part_all + task * dk * n_pad;
      const int64_t tile_begin = part * key_tiles / parts, tile_end = (part + 1) * key_tiles / parts;
      for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
        const int64_t j0 = tile * key_rows, nk = std::min(key_rows, N - j0);
        if (nk <= 0) break;
        const FloatTile kj = float_tile(k, j0, nk, dk, kbuf.data());
        const FloatTile vj = float_tile(v, j0, nk, dv, vbuf.data());
        std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
        for (int64_t i = 0; i < query_tiles; ++i) {
          const int64_t r0 = i * query_rows;
          if (r0 >= N) break;
          const int64_t rows = std::min(query_rows, N - r0), cols = round_up_cols(rows);
          const float* qt = packed_all + (bh * query_tiles + i) * packed_size;
          const float* q_rows = qt + qt_size;
          const float* dot = q_rows + q_rows_size;
          const float* do_rows = dot + dot_size;
          const float* lse2_i = lse2 + bh * n_pad + r0;
          const float* delta_i = delta + bh * n_pad + r0;
          tm.gemm_tile(nk, cols, dk, kj.ptr, kj.sn, kj.sd, qt, cols, pt.data(), cols, false);
          tm.exp2_minus(nk, cols, pt.data(), lse2_i);
          tm.gemm_tile(nk, cols, dv, vj.ptr, vj.sn, vj.sd, dot, cols, dst.data(), cols,
                       false);
          tm.softmax_grad(nk, cols, pt.data(), dst.data(), delta_i);
          tm.gemm_tile(nk, dv_pad, rows, pt.data(), cols, 1, do_rows, dv_pad,
                       dv_acc.data(), dv_pad, true);
          tm.gemm_tile(nk, dk_pad, rows, dst.data(), cols, 1, q_rows, dk_pad,
                       dk_acc.data(), dk_pad, true);
          tm.gemm_tile(dk, cols, nk, kj.ptr, kj.sd, kj.sn, dst.data(), cols, dq_part + r0, n_pad,
                       true);
        }
        const float scale_f = static_cast<float>(scale);
        store_tile(dk_acc.data(), dk_pad, 1, nk, dk, scale_f, head_view<T>(dk_t, b, h), j0, true);
        store_tile(dv_acc.data(), dv_pad, 1, nk, dv, 1.f, head_view<T>(dv_t, b, h), j0, false);
      }
    }
  });

  // dq += scale * (the parts' sums, added in part order).
  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      float* first = dq_part_all + bh * parts * dk * n_pad;
      for (int64_t part = 1; part < parts; ++part) {
        const float* other = first + part * dk * n_pad;
        for (int64_t i = 0; i < dk * n_pad; ++i) first[i] += other[i];
      }
      store_tile(first, 1, n_pad, N, dk, static_cast<float>(scale),
                 head_view<T>(dq_t, bh / H, bh % H), 0, true);
    }
  });
}

}  // namespace

void fused_bwd(const AttnShape& s, const at::Tensor& dout, const at::Tensor& q,
               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, at::Tensor& dq, at::Tensor& dk,
               at::Tensor& dv) {
  switch (q.scalar_type()) {
    case at::kFloat: return bwd_typed<float>(s, dout, q, k, v, out, lse, scale, dq, dk, dv);
    case at::kBFloat16:
      return bwd_typed<at::BFloat16>(s, dout, q, k, v, out, lse, scale, dq, dk, dv);
    case at::kHalf: return bwd_typed<at::Half>(s, dout, q, k, v, out, lse, scale, dq, dk, dv);
    default: TORCH_CHECK(false, "fused CPU attention takes float32, bfloat16 or float16, got ",
                         q.scalar_type());
  }
}

}  // namespace cpu
}  // namespace psa_fa2
