"""Eager reference math: the Ultralytics block's three lines, for tests and benchmarks."""
from __future__ import annotations

import torch
from torch import Tensor


def psa_attention_eager(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """Channel-first: q, k ``[B, H, dk, N]``, v ``[B, H, dv, N]`` -> ``[B, H, dv, N]``.

    Materialises the N x N matrix, exactly as ``ultralytics.nn.modules.block.Attention``.
    """
    scale = q.shape[2] ** -0.5 if scale is None else scale
    attn = (q.transpose(-2, -1) @ k) * scale
    attn = attn.softmax(dim=-1)
    return v @ attn.transpose(-2, -1)


def attention_eager(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """Token-major: q, k ``[B, H, N, dk]``, v ``[B, H, N, dv]`` -> ``[B, H, N, dv]``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v


def lse_eager(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """Row logsumexp of ``scale * q @ k^T`` for token-major q, k -> ``[B, H, N]``."""
    return torch.logsumexp((q @ k.transpose(-2, -1)) * scale, dim=-1)
