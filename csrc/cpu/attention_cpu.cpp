// CPU kernels: one task per (batch, head) under at::parallel_for, each walking blocks of
// query rows and, inside, blocks of keys with an online softmax, so memory is
// O(block * block) per task plus the head's K / V in the accumulation type, never O(N^2).
// The block products are matrix multiplies (BLAS); half types accumulate in fp32, float64
// in fp64.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "../checks.h"

namespace psa_fa2 {
namespace {

// Rows of Q and of K per block product: big enough for BLAS to run near its peak, small
// enough that a block of scores (kBlock x kBlock in fp32: 256 KB) stays in the L2.
constexpr int64_t kBlock = 256;

// One head's [N, D] slice of a logical [B, H, N, D] tensor.
at::Tensor head(const at::Tensor& t, int64_t b, int64_t h) { return t.select(0, b).select(0, h); }

at::Tensor rows(const at::Tensor& t, int64_t row0, int64_t count) { return t.narrow(0, row0, count); }

// Runs fn(b, h) for every head, in parallel; ops inside run below autograd (the outputs
// are plain results of this kernel, not part of any graph).
template <typename F>
void for_each_head(const AttnShape& s, F&& fn) {
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t bh = begin; bh < end; ++bh) fn(bh / s.heads, bh % s.heads);
  });
}

void fwd_kernel(const AttnShape& s, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, at::Tensor& out, at::Tensor& lse, double scale) {
  const auto acc = accumulate_dtype(q.scalar_type());
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for_each_head(s, [&](int64_t b, int64_t h) {
    const at::Tensor kh = head(k, b, h).to(acc), vh = head(v, b, h).to(acc);
    at::Tensor out_h = head(out, b, h), lse_h = lse.select(0, b).select(0, h);
    for (int64_t q0 = 0; q0 < s.seqlen; q0 += kBlock) {
      const int64_t nq = std::min(kBlock, s.seqlen - q0);
      const at::Tensor qb = rows(head(q, b, h), q0, nq).to(acc) * scale;
      at::Tensor m = at::full({nq, 1}, neg_inf, qb.options());
      at::Tensor l = at::zeros({nq, 1}, qb.options());
      at::Tensor o = at::zeros({nq, s.head_dim_v}, qb.options());
      for (int64_t k0 = 0; k0 < s.seqlen; k0 += kBlock) {
        const int64_t nk = std::min(kBlock, s.seqlen - k0);
        const at::Tensor scores = at::mm(qb, rows(kh, k0, nk).t());
        const at::Tensor m_new = at::maximum(m, std::get<0>(scores.max(1, true)));
        // While a row has seen only -inf scores, 0 is its reference point: exp(-inf) = 0
        // rather than NaN, and a row that stays all -inf ends as 0 / 0 = NaN, as eager
        // softmax gives. NaN scores keep propagating through max and exp.
        const at::Tensor m_ref = at::where(m_new == neg_inf, at::zeros_like(m_new), m_new);
        const at::Tensor alpha = (m - m_ref).exp_();
        const at::Tensor p = (scores - m_ref).exp_();
        l = l * alpha + p.sum(1, true);
        o = o * alpha + at::mm(p, rows(vh, k0, nk));
        m = m_new;
      }
      rows(out_h, q0, nq).copy_(o / l);
      rows(lse_h, q0, nq).copy_((m + l.log()).squeeze(1));
    }
  });
}

// P and dS of a block of query rows against a block of keys, recomputed from lse.
struct BlockGrads {
  at::Tensor p, ds;
};

BlockGrads block_grads(const at::Tensor& qb, const at::Tensor& gb, const at::Tensor& kb,
                       const at::Tensor& vb, const at::Tensor& lse_b, const at::Tensor& delta_b,
                       double scale) {
  at::Tensor p = (at::mm(qb, kb.t()) * scale - lse_b).exp_();
  at::Tensor ds = p * (at::mm(gb, vb.t()) - delta_b);
  return {p, ds};
}

// One pass per head: dQ of each query block is finished inside its loop over keys, while
// dK / dV sum over all query blocks in head-sized fp32 / fp64 accumulators.
void bwd_kernel(const AttnShape& s, const at::Tensor& dout, const at::Tensor& q,
                const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                double scale) {
  const auto acc = accumulate_dtype(q.scalar_type());
  for_each_head(s, [&](int64_t b, int64_t h) {
    const at::Tensor qh = head(q, b, h).to(acc), kh = head(k, b, h).to(acc);
    const at::Tensor vh = head(v, b, h).to(acc), gh = head(dout, b, h).to(acc);
    // D_i = sum_d dout_id * out_id, the softmax-gradient row term.
    const at::Tensor delta = (gh * head(out, b, h).to(acc)).sum(1, true);
    const at::Tensor lse_h = lse.select(0, b).select(0, h).unsqueeze(1);
    at::Tensor dk_acc = at::zeros_like(kh), dv_acc = at::zeros_like(vh);
    at::Tensor dq_h = head(dq, b, h);
    for (int64_t q0 = 0; q0 < s.seqlen; q0 += kBlock) {
      const int64_t nq = std::min(kBlock, s.seqlen - q0);
      const at::Tensor qb = rows(qh, q0, nq), gb = rows(gh, q0, nq);
      const at::Tensor lse_b = rows(lse_h, q0, nq), delta_b = rows(delta, q0, nq);
      at::Tensor dq_b = at::zeros({nq, s.head_dim_qk}, qh.options());
      for (int64_t k0 = 0; k0 < s.seqlen; k0 += kBlock) {
        const int64_t nk = std::min(kBlock, s.seqlen - k0);
        const at::Tensor kb = rows(kh, k0, nk), vb = rows(vh, k0, nk);
        const BlockGrads g = block_grads(qb, gb, kb, vb, lse_b, delta_b, scale);
        dq_b.addmm_(g.ds, kb);
        rows(dk_acc, k0, nk).addmm_(g.ds.t(), qb);
        rows(dv_acc, k0, nk).addmm_(g.p.t(), gb);
      }
      // dq and dk are accumulated into (the seed's contract), dv is written.
      rows(dq_h, q0, nq).add_(dq_b * scale);
    }
    head(dk, b, h).add_(dk_acc * scale);
    head(dv, b, h).copy_(dv_acc);
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
  fwd_kernel(s, q, k, v, out, lse, scale);
  return {out, lse};
}

void bwd_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, double scale, at::Tensor& dq,
             at::Tensor& dk, at::Tensor& dv, c10::string_view impl, bool /*deterministic*/,
             bool accumulate) {
  const AttnShape s = check_bwd_inputs(dout, q, k, v, out, lse, dq, dk, dv);
  check_cpu_impl(parse_impl(impl));
  if (!accumulate) zero_qk_grads(dq, dk);
  if (q.numel() == 0 || v.numel() == 0) return;
  // Each head is one task that sums in a fixed order: deterministic by construction.
  bwd_kernel(s, dout, q, k, v, out, lse, dq, dk, dv, scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

}  // namespace psa_fa2
