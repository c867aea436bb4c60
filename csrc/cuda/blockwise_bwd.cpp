// See blockwise_bwd.h. Per query block [i0, i1) of every (batch, head) at once:
//   S  = q_i k^T              P  = exp(scale S - lse_i)
//   dP = dout_i v^T           dS = P * (dP - D_i),  D = rowsum(dout * out)
//   dq_i += scale dS k        dk += scale dS^T q_i  dv += P^T dout_i
#include "blockwise_bwd.h"

#include <algorithm>

namespace psa_fa2 {

namespace {

// Elements of one [B, H, block, N] fp32 intermediate; three are live at a time (768 MB).
// Smaller blocks make skinny matmuls: at B*H = 32, N = 6400 a 64 MB block is 81 query rows.
constexpr int64_t kBlockElems = int64_t(1) << 26;  // 256 MB

}  // namespace

void blockwise_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                   double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  const int64_t block = std::clamp<int64_t>(kBlockElems / std::max<int64_t>(B * H * N, 1), 1, N);
  const at::Tensor delta = (dout * out).sum(-1, /*keepdim=*/true);  // [B, H, N, 1]
  const at::Tensor kt = k.transpose(-2, -1), vt = v.transpose(-2, -1);
  const at::Tensor lse4 = lse.unsqueeze(-1);
  dv.zero_();
  for (int64_t i0 = 0; i0 < N; i0 += block) {
    const int64_t len = std::min(block, N - i0);
    const at::Tensor q_i = q.narrow(2, i0, len), dout_i = dout.narrow(2, i0, len);
    const at::Tensor p = at::exp(at::matmul(q_i, kt).mul_(scale).sub_(lse4.narrow(2, i0, len)));
    at::Tensor ds = at::matmul(dout_i, vt).sub_(delta.narrow(2, i0, len)).mul_(p);
    dq.narrow(2, i0, len).add_(at::matmul(ds, k), scale);
    dk.add_(at::matmul(ds.transpose(-2, -1), q_i), scale);
    dv.add_(at::matmul(p.transpose(-2, -1), dout_i));
  }
}

}  // namespace psa_fa2
