"""Float64 yardstick for the benchmark's error columns.

Channel-first like the PSA block: q, k [B, H, dk, N], v [B, H, dv, N], out [B, H, dv, N].
"""
import torch

# Bytes one float64 [B, H, rows, N] block may take. Two such blocks live at once (scores and,
# with gradients, dS), so this keeps the reference near 2 GiB even at N = 62 500, where the
# whole N x N matrix would need 31 GB per batch-head in float64.
BLOCK_BYTES = 1 << 30


def reference(q, k, v, scale, dout=None):
    """Returns (out, dq, dk, dv) in float64; the grads are None when dout is None.

    Exact over all query rows and all keys: the query rows are processed in blocks,
    each against every key, so no approximation or row subset is needed at any N.
    The two blocks are allocated once and written in place: on the CPU, fresh GiB blocks
    per step spent more time in page faults than in the matmuls.
    """
    Q, K, V = q.double(), k.double(), v.double()
    B, H, _, N = Q.shape
    rows = max(1, min(N, BLOCK_BYTES // (B * H * N * 8)))
    out = torch.empty(V.shape, dtype=torch.float64, device=V.device)
    scores = torch.empty(B * H * rows * N, dtype=torch.float64, device=V.device)
    grads = dout is not None
    if grads:
        dO = dout.double()
        dq = torch.empty_like(Q)
        dk = torch.zeros_like(K)
        dv = torch.zeros_like(V)
        ds_buf = torch.empty_like(scores)
    for i0 in range(0, N, rows):
        i1 = min(N, i0 + rows)
        m = i1 - i0
        qb = Q[..., i0:i1]                                   # [B, H, dk, m]
        p = scores[: B * H * m * N].view(B, H, m, N)         # contiguous, also when m < rows
        torch.matmul(qb.transpose(-2, -1), K, out=p)
        p.mul_(scale)
        p.sub_(p.amax(-1, keepdim=True)).exp_()
        p.div_(p.sum(-1, keepdim=True))                      # softmax over all keys
        ob = V @ p.transpose(-2, -1)                         # [B, H, dv, m]
        out[..., i0:i1] = ob
        if grads:
            dob = dO[..., i0:i1]                             # [B, H, dv, m]
            ds = ds_buf[: B * H * m * N].view(B, H, m, N)
            torch.matmul(dob.transpose(-2, -1), V, out=ds)   # dP
            ds.sub_((dob * ob).sum(-2).unsqueeze(-1)).mul_(p)  # dS = P * (dP - rowsum(dO * O))
            dq[..., i0:i1] = (K @ ds.transpose(-2, -1)) * scale
            dk.add_(qb @ ds, alpha=scale)
            dv.add_(dob @ p)
    return (out, dq, dk, dv) if grads else (out, None, None, None)


class Cache:
    """References by their inputs' values: runs of one shape in several dtypes whose inputs
    hold the same numbers (bf16-exact values, as the benchmark draws them for 16-bit and CPU
    rows) share one reference; other inputs miss and get their own."""

    def __init__(self):
        self._entries = {}

    def get(self, q, k, v, scale, dout=None):
        """The cached reference of these inputs, or None."""
        entry = self._entries.get(self._key(q, v, scale, dout))
        if entry is None:
            return None
        inputs, ref = entry
        same = all(torch.equal(x.detach().to("cpu", torch.float64), y)
                   for x, y in zip((q, k, v, dout), inputs) if x is not None)
        return ref if same else None

    def put(self, q, k, v, scale, dout, ref):
        # Float64 CPU images of the inputs: O(B*H*N*D), small beside the N x N work they save.
        inputs = tuple(None if x is None else x.detach().to("cpu", torch.float64)
                       for x in (q, k, v, dout))
        self._entries[self._key(q, v, scale, dout)] = (inputs, ref)

    @staticmethod
    def _key(q, v, scale, dout):
        return (tuple(q.shape), tuple(v.shape), scale, dout is not None, q.device.type)


def rel_err(x, ref):
    """max |x - ref| / max |ref|: one number per tensor, comparable across dtypes."""
    if x is None or ref is None:
        return None
    denom = ref.abs().max().item()
    err = (x.detach().to(ref.device, torch.float64) - ref).abs().max().item()
    return err / denom if denom > 0 else err
