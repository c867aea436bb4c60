// CPU kernels: blockwise over query rows (and key rows for dK / dV) with online softmax,
// so memory is O(block * N) per thread, never O(N^2). Half types accumulate in fp32,
// float64 in fp64.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../checks.h"
#include "../make_params.h"

namespace psa_fa2 {
namespace {

// Query rows per task: small enough that B*H*N/kBlockQ tasks keep every core busy,
// large enough that each K/V block loaded into the cache is reused.
constexpr int64_t kBlockQ = 32;
constexpr int64_t kBlockK = 128;

// Copies rows [row0, row0 + rows) of one head of a strided [B, H, N, D] tensor into a
// contiguous [rows, D] buffer of the accumulation type.
template <typename T, typename Acc>
void load_rows(const T* base, const Strided4& s, int64_t row0, int64_t rows, int64_t d,
               Acc* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = base + (row0 + r) * s.stride_n;
    for (int64_t c = 0; c < d; ++c) dst[r * d + c] = static_cast<Acc>(row[c * s.stride_d]);
  }
}

template <typename T>
const T* head_ptr(const Strided4& s, int64_t b, int64_t h) {
  return static_cast<const T*>(s.ptr) + b * s.stride_b + h * s.stride_h;
}

template <typename Acc>
Acc dot(const Acc* a, const Acc* b, int64_t d) {
  Acc sum = 0;
  for (int64_t c = 0; c < d; ++c) sum += a[c] * b[c];
  return sum;
}

// Parallel loop over (batch*head, block of rows) tasks.
template <typename F>
void for_each_block(const AttnShape& s, int64_t block, F&& body) {
  const int64_t blocks = (s.seqlen + block - 1) / block;
  at::parallel_for(0, s.batch * s.heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks;
      const int64_t row0 = (task % blocks) * block;
      body(bh / s.heads, bh % s.heads, row0, std::min(block, s.seqlen - row0));
    }
  });
}

template <typename T, typename Acc>
void fwd_kernel(const AttnShape& s, const FwdParams& p) {
  const int64_t dk = s.head_dim_qk, dv = s.head_dim_v, N = s.seqlen;
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  for_each_block(s, kBlockQ, [&](int64_t b, int64_t h, int64_t q0, int64_t rows) {
    std::vector<Acc> q(rows * dk), kb(kBlockK * dk), vb(kBlockK * dv), acc(rows * dv, Acc(0));
    std::vector<Acc> m(rows, neg_inf), l(rows, Acc(0)), pr(kBlockK);
    load_rows(head_ptr<T>(p.q, b, h), p.q, q0, rows, dk, q.data());
    for (auto& x : q) x *= static_cast<Acc>(p.scale);
    for (int64_t k0 = 0; k0 < N; k0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, N - k0);
      load_rows(head_ptr<T>(p.k, b, h), p.k, k0, cols, dk, kb.data());
      load_rows(head_ptr<T>(p.v, b, h), p.v, k0, cols, dv, vb.data());
      for (int64_t r = 0; r < rows; ++r) {
        Acc block_max = neg_inf;
        for (int64_t j = 0; j < cols; ++j) {
          pr[j] = dot(&q[r * dk], &kb[j * dk], dk);
          block_max = std::max(block_max, pr[j]);
        }
        const Acc m_new = std::max(m[r], block_max);
        // A row whose scores are all -inf so far has no reference point yet; using 0 keeps
        // exp(-inf - 0) = 0 instead of NaN, and the final 0/0 gives eager's NaN.
        const Acc m_ref = m_new == neg_inf ? Acc(0) : m_new;
        const Acc alpha = std::exp(m[r] - m_ref);
        Acc* o = &acc[r * dv];
        for (int64_t c = 0; c < dv; ++c) o[c] *= alpha;
        Acc sum = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const Acc pj = std::exp(pr[j] - m_ref);
          sum += pj;
          const Acc* vj = &vb[j * dv];
          for (int64_t c = 0; c < dv; ++c) o[c] += pj * vj[c];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
      }
    }
    T* out = static_cast<T*>(p.out.ptr) + b * p.out.stride_b + h * p.out.stride_h;
    Acc* lse = static_cast<Acc*>(p.lse) + (b * s.heads + h) * N;
    for (int64_t r = 0; r < rows; ++r) {
      T* orow = out + (q0 + r) * p.out.stride_n;
      for (int64_t c = 0; c < dv; ++c) orow[c * p.out.stride_d] = static_cast<T>(acc[r * dv + c] / l[r]);
      lse[q0 + r] = m[r] + std::log(l[r]);
    }
  });
}

// D_i = sum_d dout_id * out_id, the softmax-gradient row term.
template <typename T, typename Acc>
void delta_kernel(const AttnShape& s, const BwdParams& p, Acc* delta) {
  const int64_t dv = s.head_dim_v;
  for_each_block(s, kBlockQ, [&](int64_t b, int64_t h, int64_t r0, int64_t rows) {
    const T* o = head_ptr<T>(p.out, b, h);
    const T* g = head_ptr<T>(p.dout, b, h);
    for (int64_t r = r0; r < r0 + rows; ++r) {
      Acc sum = 0;
      for (int64_t c = 0; c < dv; ++c)
        sum += static_cast<Acc>(o[r * p.out.stride_n + c * p.out.stride_d]) *
               static_cast<Acc>(g[r * p.dout.stride_n + c * p.dout.stride_d]);
      delta[(b * s.heads + h) * s.seqlen + r] = sum;
    }
  });
}

// Adds (accumulate) or stores a contiguous [rows, D] block into a strided tensor.
template <typename T, typename Acc>
void store_rows(const Strided4& s, int64_t b, int64_t h, int64_t row0, int64_t rows, int64_t d,
                const Acc* src, Acc factor, bool accumulate) {
  T* base = static_cast<T*>(s.ptr) + b * s.stride_b + h * s.stride_h;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = base + (row0 + r) * s.stride_n;
    for (int64_t c = 0; c < d; ++c) {
      const Acc x = src[r * d + c] * factor;
      T& dst = row[c * s.stride_d];
      dst = static_cast<T>(accumulate ? static_cast<Acc>(dst) + x : x);
    }
  }
}

// Two passes, both parallel without atomics: dQ over query blocks, then dK / dV over key
// blocks, each recomputing P from lse (the combined schedule of the CUDA reference kernel).
template <typename T, typename Acc>
void bwd_kernel(const AttnShape& s, const BwdParams& p) {
  const int64_t dk = s.head_dim_qk, dv = s.head_dim_v, N = s.seqlen;
  const Acc scale = static_cast<Acc>(p.scale);
  const Acc* lse_all = static_cast<const Acc*>(p.lse);
  const Acc* delta_all = static_cast<const Acc*>(p.delta);
  delta_kernel<T, Acc>(s, p, static_cast<Acc*>(p.delta));

  // dS_ij for a row block i and a column block j; fills ds (and prob, if given).
  auto scores_grad = [&](const Acc* qb, const Acc* gb, const Acc* kb, const Acc* vb,
                         const Acc* lse, const Acc* delta, int64_t rows, int64_t cols, Acc* ds,
                         Acc* prob) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const Acc pij = std::exp(dot(&qb[i * dk], &kb[j * dk], dk) * scale - lse[i]);
        const Acc dpij = dot(&gb[i * dv], &vb[j * dv], dv);
        ds[i * cols + j] = pij * (dpij - delta[i]);
        if (prob) prob[i * cols + j] = pij;
      }
    }
  };

  for_each_block(s, kBlockQ, [&](int64_t b, int64_t h, int64_t q0, int64_t rows) {
    std::vector<Acc> qb(rows * dk), gb(rows * dv), kb(kBlockK * dk), vb(kBlockK * dv);
    std::vector<Acc> ds(rows * kBlockK), dq(rows * dk, Acc(0));
    load_rows(head_ptr<T>(p.q, b, h), p.q, q0, rows, dk, qb.data());
    load_rows(head_ptr<T>(p.dout, b, h), p.dout, q0, rows, dv, gb.data());
    const int64_t row_base = (b * s.heads + h) * N + q0;
    for (int64_t k0 = 0; k0 < N; k0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, N - k0);
      load_rows(head_ptr<T>(p.k, b, h), p.k, k0, cols, dk, kb.data());
      load_rows(head_ptr<T>(p.v, b, h), p.v, k0, cols, dv, vb.data());
      scores_grad(qb.data(), gb.data(), kb.data(), vb.data(), lse_all + row_base,
                  delta_all + row_base, rows, cols, ds.data(), nullptr);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const Acc dsij = ds[i * cols + j];
          for (int64_t c = 0; c < dk; ++c) dq[i * dk + c] += dsij * kb[j * dk + c];
        }
    }
    store_rows<T, Acc>(p.dq, b, h, q0, rows, dk, dq.data(), scale, /*accumulate=*/true);
  });

  for_each_block(s, kBlockQ, [&](int64_t b, int64_t h, int64_t k0, int64_t cols) {
    std::vector<Acc> kb(cols * dk), vb(cols * dv), qb(kBlockK * dk), gb(kBlockK * dv);
    std::vector<Acc> ds(kBlockK * cols), prob(kBlockK * cols);
    std::vector<Acc> dkb(cols * dk, Acc(0)), dvb(cols * dv, Acc(0));
    load_rows(head_ptr<T>(p.k, b, h), p.k, k0, cols, dk, kb.data());
    load_rows(head_ptr<T>(p.v, b, h), p.v, k0, cols, dv, vb.data());
    const int64_t head_base = (b * s.heads + h) * N;
    for (int64_t q0 = 0; q0 < N; q0 += kBlockK) {
      const int64_t rows = std::min(kBlockK, N - q0);
      load_rows(head_ptr<T>(p.q, b, h), p.q, q0, rows, dk, qb.data());
      load_rows(head_ptr<T>(p.dout, b, h), p.dout, q0, rows, dv, gb.data());
      scores_grad(qb.data(), gb.data(), kb.data(), vb.data(), lse_all + head_base + q0,
                  delta_all + head_base + q0, rows, cols, ds.data(), prob.data());
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const Acc dsij = ds[i * cols + j], pij = prob[i * cols + j];
          for (int64_t c = 0; c < dk; ++c) dkb[j * dk + c] += dsij * qb[i * dk + c];
          for (int64_t c = 0; c < dv; ++c) dvb[j * dv + c] += pij * gb[i * dv + c];
        }
    }
    store_rows<T, Acc>(p.dk, b, h, k0, cols, dk, dkb.data(), scale, /*accumulate=*/true);
    store_rows<T, Acc>(p.dv, b, h, k0, cols, dv, dvb.data(), Acc(1), /*accumulate=*/false);
  });
}

void check_cpu_impl(Impl impl) {
  TORCH_CHECK(impl != Impl::kFast,
              "impl=\"fast\" needs CUDA tensors; the CPU has one kernel (use \"auto\" or "
              "\"reference\")");
}

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale,
                                           c10::string_view impl) {
  const AttnShape s = check_fwd_inputs(q, k, v);
  check_cpu_impl(parse_impl(impl));
  at::Tensor out = empty_in_layout(s, s.head_dim_v, s.layout, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads, s.seqlen},
                             q.options().dtype(accumulate_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  const FwdParams p = make_fwd_params(s, q, k, v, out, lse, scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "psa_fa2_fwd_cpu", [&] {
    fwd_kernel<scalar_t, at::opmath_type<scalar_t>>(s, p);
  });
  return {out, lse};
}

void bwd_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, double scale, at::Tensor& dq,
             at::Tensor& dk, at::Tensor& dv, c10::string_view impl, bool /*deterministic*/) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  check_cpu_impl(parse_impl(impl));
  if (q.numel() == 0 || v.numel() == 0) return;
  at::Tensor delta = at::empty_like(lse);
  const BwdParams p = make_bwd_params(s, dout, q, k, v, out, lse, delta, dq, dk, dv, scale);
  // Every task writes its own rows and sums in a fixed order: deterministic by construction.
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "psa_fa2_bwd_cpu", [&] {
    bwd_kernel<scalar_t, at::opmath_type<scalar_t>>(s, p);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

}  // namespace psa_fa2
