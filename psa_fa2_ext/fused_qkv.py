"""One gradient buffer for the PSA block's qkv tensor.

Ultralytics feeds attention the three `split` views of one conv output. Autograd would give
each view its own gradient and then copy the three into the conv output's gradient (the
split's backward is a cat). When q, k and v are exactly those views, this path runs the
operators on views of the conv output itself and has the backward write dq, dk and dv
straight into one d_qkv buffer, so autograd adds no copy and no sum.
"""
from __future__ import annotations

import torch
from torch import Tensor


def split_base(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The tensor q, k and v ([B, H, D, N]) were split from, when they are exactly
    ``base.view(B, H, 2*dk + dv, N).split([dk, dk, dv], dim=2)`` of a contiguous base;
    else None."""
    base = q._base
    if base is None or k._base is not base or v._base is not base or not base.is_contiguous():
        return None
    if base.requires_grad != (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    B, H, dk, N = q.shape
    dv = v.shape[2]
    C = 2 * dk + dv
    if base.numel() != B * H * C * N or k.shape != q.shape or v.shape[:2] != q.shape[:2]:
        return None
    view_strides = (H * C * N, C * N, N, 1)
    if q.stride() != view_strides or k.stride() != view_strides or v.stride() != view_strides:
        return None
    offset = base.storage_offset()
    if (q.storage_offset(), k.storage_offset(), v.storage_offset()) != (
            offset, offset + dk * N, offset + 2 * dk * N):
        return None
    return base


class SplitQKVAttention(torch.autograd.Function):
    """psa_attention on the split views of `base`, differentiable in `base` directly."""

    @staticmethod
    def forward(ctx, base: Tensor, B: int, H: int, dk: int, dv: int, N: int, scale: float,
                impl: str) -> Tensor:
        q, k, v = (t.transpose(2, 3) for t in base.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
        out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, impl)
        ctx.save_for_backward(base, out, lse)
        ctx.dims = (B, H, dk, dv, N)
        ctx.scale, ctx.impl = scale, impl
        return out.transpose(2, 3)

    @staticmethod
    def backward(ctx, dout: Tensor):
        base, out, lse = ctx.saved_tensors
        B, H, dk, dv, N = ctx.dims
        C = 2 * dk + dv
        q, k, v = (t.transpose(2, 3) for t in base.view(B, H, C, N).split([dk, dk, dv], dim=2))
        # dq and dk are accumulated into. One contiguous memset of the whole buffer (dv is
        # overwritten anyway) costs the host far less than a strided fill of the dq / dk part.
        d_base = torch.zeros(B, H, C, N, dtype=base.dtype, device=base.device)
        dq, dk_, dv_ = (t.transpose(2, 3) for t in d_base.split([dk, dk, dv], dim=2))
        dout = dout.transpose(2, 3)
        if not (dout.size(2) <= 1 or dout.stride(2) == 1):
            dout = dout.transpose(2, 3).contiguous().transpose(2, 3)
        torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, ctx.scale, dq, dk_, dv_, ctx.impl,
                              torch.are_deterministic_algorithms_enabled())
        return d_base.view(base.shape), None, None, None, None, None, None, None
