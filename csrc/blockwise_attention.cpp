// See blockwise_attention.h. Per query block [i0, i1) of every (batch, head) at once:
//   forward:   S = (scale q_i) k^T    m = rowmax(S)       P = exp(S - m)
//              out_i = (P v) / rowsum(P)                  lse_i = m + log(rowsum(P))
//   backward:  P  = exp((scale q_i) k^T - lse_i)          dP = dout_i v^T
//              dS = P * (dP - D_i),  D = rowsum(dout * out)
//              dq_i += scale dS k     dk += scale dS^T q_i   dv += P^T dout_i
#include "blockwise_attention.h"

#include <algorithm>
#include <limits>

#include "checks.h"

namespace psa_fa2 {

namespace {

// Query rows per block: the [B, H, block, N] intermediates hold about block_elems elements.
int64_t rows_per_block(const at::Tensor& q, int64_t block_elems) {
  const int64_t bhn = std::max<int64_t>(q.size(0) * q.size(1) * q.size(2), 1);
  return std::clamp<int64_t>(block_elems / bhn, 1, std::max<int64_t>(q.size(2), 1));
}

}  // namespace

void blockwise_fwd(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                   double scale, at::Tensor& out, at::Tensor& lse, int64_t block_elems) {
  // The intermediates are this kernel's own, never part of an autograd graph.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto acc = accumulate_dtype(q_in.scalar_type());
  const at::Tensor q = q_in.to(acc), k = k_in.to(acc), v = v_in.to(acc);
  const int64_t N = q.size(2), block = rows_per_block(q, block_elems);
  const at::Tensor kt = k.transpose(-2, -1);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t i0 = 0; i0 < N; i0 += block) {
    const int64_t len = std::min(block, N - i0);
    // scale on the [len, dk] rows of q rather than on the [len, N] scores: one pass less.
    at::Tensor s = at::matmul(q.narrow(2, i0, len) * scale, kt);
    // A row of only -inf scores takes 0 as its reference: exp(-inf) = 0 rather than NaN,
    // and the row ends as 0 / 0 = NaN, as eager softmax gives. NaN scores propagate.
    // amax, not max: max also finds the indices, which took the CPU forward 18% of its time
    // at B,H,N = 1,4,400 (2.7x amax's time in that op alone).
    const at::Tensor m = s.amax(-1, /*keepdim=*/true);
    const at::Tensor m_ref = m.masked_fill(m == neg_inf, 0.0);
    const at::Tensor p = s.sub_(m_ref).exp_();
    const at::Tensor l = p.sum(-1, /*keepdim=*/true);
    out.narrow(2, i0, len).copy_(at::matmul(p, v).div_(l));
    lse.narrow(2, i0, len).copy_(m_ref.add(l.log()).squeeze(-1));
  }
}

void blockwise_bwd(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                   const at::Tensor& v_in, const at::Tensor& out, const at::Tensor& lse,
                   double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                   int64_t block_elems) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto acc = accumulate_dtype(q_in.scalar_type());
  const at::Tensor q = q_in.to(acc), k = k_in.to(acc), v = v_in.to(acc);
  const at::Tensor dout = dout_in.to(acc);
  const int64_t N = q.size(2), block = rows_per_block(q, block_elems);
  const at::Tensor delta = (dout * out.to(acc)).sum(-1, /*keepdim=*/true);  // [B, H, N, 1]
  const at::Tensor kt = k.transpose(-2, -1), vt = v.transpose(-2, -1);
  const at::Tensor lse4 = lse.unsqueeze(-1);
  // Gradients sum over blocks in the accumulation type: in dq / dk / dv themselves when
  // they have it, else in buffers folded in once at the end.
  const bool direct = dq.scalar_type() == acc;
  at::Tensor dq_acc = direct ? dq : at::zeros(dq.sizes(), dq.options().dtype(acc));
  at::Tensor dk_acc = direct ? dk : at::zeros(dk.sizes(), dk.options().dtype(acc));
  at::Tensor dv_acc = direct ? dv.zero_() : at::zeros(dv.sizes(), dv.options().dtype(acc));
  for (int64_t i0 = 0; i0 < N; i0 += block) {
    const int64_t len = std::min(block, N - i0);
    const at::Tensor q_i = q.narrow(2, i0, len), dout_i = dout.narrow(2, i0, len);
    const at::Tensor p = at::matmul(q_i * scale, kt).sub_(lse4.narrow(2, i0, len)).exp_();
    at::Tensor ds = at::matmul(dout_i, vt).sub_(delta.narrow(2, i0, len)).mul_(p);
    dq_acc.narrow(2, i0, len).add_(at::matmul(ds, k), scale);
    dk_acc.add_(at::matmul(ds.transpose(-2, -1), q_i), scale);
    dv_acc.add_(at::matmul(p.transpose(-2, -1), dout_i));
  }
  if (!direct) {
    dq.add_(dq_acc);
    dk.add_(dk_acc);
    dv.copy_(dv_acc);
  }
}

}  // namespace psa_fa2
