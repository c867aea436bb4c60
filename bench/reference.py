"""Float64 yardstick for the benchmark's error columns.

Channel-first like the PSA block: q, k [B, H, dk, N], v [B, H, dv, N], out [B, H, dv, N].
"""
import torch

# Bytes one float64 [B, H, rows, N] block may take. Four such blocks live at once in the
# backward, so this keeps the reference near 4 GiB even at N = 62 500, where the whole
# N x N matrix would need 31 GB per batch-head in float64.
BLOCK_BYTES = 1 << 30


def reference(q, k, v, scale, dout=None):
    """Returns (out, dq, dk, dv) in float64; the grads are None when dout is None.

    Exact over all query rows and all keys: the query rows are processed in blocks,
    each against every key, so no approximation or row subset is needed at any N.
    """
    Q, K, V = q.double(), k.double(), v.double()
    B, H, _, N = Q.shape
    rows = max(1, BLOCK_BYTES // (B * H * N * 8))
    out = torch.empty(V.shape, dtype=torch.float64, device=V.device)
    grads = dout is not None
    if grads:
        dO = dout.double()
        dq = torch.empty_like(Q)
        dk = torch.zeros_like(K)
        dv = torch.zeros_like(V)
    for i0 in range(0, N, rows):
        i1 = min(N, i0 + rows)
        qb = Q[..., i0:i1]                                  # [B, H, dk, m]
        p = ((qb.transpose(-2, -1) @ K) * scale).softmax(-1)  # [B, H, m, N]
        ob = V @ p.transpose(-2, -1)                         # [B, H, dv, m]
        out[..., i0:i1] = ob
        if grads:
            dob = dO[..., i0:i1]                             # [B, H, dv, m]
            dp = dob.transpose(-2, -1) @ V                   # [B, H, m, N]
            delta = (dob * ob).sum(-2).unsqueeze(-1)         # [B, H, m, 1]
            ds = p * (dp - delta)
            dq[..., i0:i1] = (K @ ds.transpose(-2, -1)) * scale
            dk += (qb @ ds) * scale
            dv += dob @ p
            del dp, ds
        del p
    return (out, dq, dk, dv) if grads else (out, None, None, None)


def rel_err(x, ref):
    """max |x - ref| / max |ref|: one number per tensor, comparable across dtypes."""
    if x is None or ref is None:
        return None
    denom = ref.abs().max().item()
    err = (x.detach().double() - ref).abs().max().item()
    return err / denom if denom > 0 else err
