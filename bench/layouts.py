"""What each benchmarked block hands its attention, and the float64 reference in the layout
its peers return (peers.py states the same conventions from the peers' side).

- psa: YOLOv10 / 11 / 26 ``Attention``. Inputs: the qkv conv output [B, H*(2dk+dv), h, w],
  split channel-first into q, k [B, H, dk, N] and v [B, H, dv, N]. Output: [B, H, dv, N]
  contiguous, which the block views as [B, C, h, w].
- aattn: YOLO12 ``AAttn``. The same split of its qkv conv output (dk = dv = head_dim), the
  attention within ``area`` equal runs of N; output as psa. Its attention calls are
  (B * area, H, N / area): the issue's and the tables' second notation.
- aifi: RT-DETR ``AIFI``'s ``nn.MultiheadAttention``. Inputs: the three in-projections
  [B, N, C], each viewed as heads [B, H, N, D] (token-major, no copy). Output: [B, N, C]
  contiguous, what the out-projection reads.
"""
import math

import torch

BLOCKS = ("psa", "aattn", "aifi")
LABELS = {"psa": "PSA", "aattn": "AAttn", "aifi": "AIFI"}


def attn_dims(B, H, N, area=1):
    """(batch, heads, tokens) of the attention calls a block of this shape makes."""
    return B * area, H, N // area


def grid(N):
    # A feature map h x w with h*w == N, as close to square as N allows.
    h = int(math.isqrt(N))
    while N % h:
        h -= 1
    return h, N // h


def make_inputs(case, B, H, N, seed):
    """(src, dout): src is the qkv conv output (psa, aattn) or the three projections (aifi)."""
    # A CPU generator: the same numbers on every device, and no use of the CUDA generator,
    # whose state a peer's failed graph capture could have broken. Rounded to bf16 for the
    # 16-bit rows and for every CPU row, so that a shape's runs hold the same numbers and share
    # one float64 reference (on a CPU a second one costs ~17 s at 25 600 tokens). fp32 rows on
    # a GPU keep full fp32 values: TF32 rounding of bf16-exact operands would be exact and
    # hide its error.
    gen = torch.Generator().manual_seed(seed)
    if case.block == "aifi":
        src = tuple(torch.randn(B, N, H * d, generator=gen) for d in (case.dk, case.dk, case.dv))
        dout = torch.randn(B, N, H * case.dv, generator=gen)
    else:
        h, w = grid(N)
        src = torch.randn(B, H * (2 * case.dk + case.dv), h, w, generator=gen)
        dout = torch.randn(B, H, case.dv, N, generator=gen)
    rounded = case.dtype in (torch.bfloat16, torch.float16) or case.device.type == "cpu"

    def place(x):
        return (x.bfloat16() if rounded else x).to(case.device, case.dtype)
    src = tuple(map(place, src)) if isinstance(src, tuple) else place(src)
    return src, place(dout)


def leaf(src):
    """src as the leaf (or leaves) a fwd+bwd row differentiates."""
    if isinstance(src, tuple):
        return tuple(x.detach().requires_grad_(True) for x in src)
    return src.detach().requires_grad_(True)


def detached(src):
    return tuple(x.detach() for x in src) if isinstance(src, tuple) else src.detach()


def split_views(qkv, H, dk, dv):
    # Exactly the PSA block's line: [B, H*(2dk+dv), h, w] -> three [B, H, D, N] views.
    B = qkv.shape[0]
    N = qkv.shape[2] * qkv.shape[3]
    return qkv.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)


def views(block, src, H, dk, dv):
    """The q, k, v every peer of the block starts from."""
    if block == "aifi":
        # nn.MultiheadAttention's view of each projection as heads.
        return tuple(x.view(x.shape[0], x.shape[1], H, -1).transpose(1, 2) for x in src)
    return split_views(src, H, dk, dv)


def grads_to_views(block, grads, H, dk, dv):
    """The gradient(s) of src, as the peers' dq, dk, dv."""
    return tuple(grads) if block == "aifi" else split_views(grads[0], H, dk, dv)


def to_reference(block, area, q, k, v, dout):
    """q, k, v, dout as reference.py takes them: channel-first [B', H, D, N'], one attention
    call per batch entry (an area is a batch entry of its own)."""
    if block == "aifi":
        B, N, _ = dout.shape
        H = q.shape[1]
        return (q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3),
                dout.view(B, N, H, -1).permute(0, 2, 3, 1))
    if area == 1:
        return q, k, v, dout

    def runs(x):   # [B, H, D, N] -> [B * area, H, D, N / area]
        B, H, D, N = x.shape
        return x.unflatten(3, (area, N // area)).permute(0, 3, 1, 2, 4).reshape(B * area, H, D, -1)
    return runs(q), runs(k), runs(v), runs(dout)


def from_reference(block, area, ref):
    """reference.py's (out, dq, dk, dv) in the layout the peers' outputs have."""
    def back(x):
        if x is None:
            return None
        Bp, H, D, Np = x.shape
        if block == "aifi":   # [B, H, D, N] -> [B, N, H * D]
            return x.permute(0, 3, 1, 2).reshape(Bp, Np, H * D)
        if area == 1:
            return x
        return x.view(Bp // area, area, H, D, Np).permute(0, 2, 3, 1, 4).reshape(Bp // area, H, D, -1)
    return tuple(back(x) for x in ref)
