"""The forwards of Ultralytics' other attention blocks with their N x N part on our ops:
YOLO12's area attention (``AAttn``) and RT-DETR's AIFI encoder attention (the
``nn.MultiheadAttention`` inside ``AIFI``). ``patch.py`` switches blocks to them.

Each keeps the block's own projections, reshapes and rounding points, so a patched block
computes what Ultralytics' does to round-off (float64: 1e-9 relative in tests/test_blocks.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .ops import attention, psa_attention


def aattn_forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``AAttn.forward`` (ultralytics 8.3.x and 8.4.x) with ``softmax(q^T k) v`` on
    ``psa_attention``.

    Ultralytics splits heads out of the qkv conv output through a token-major view and, with
    ``area > 1``, first copies it to ``[B * area, N / area, 3C]``, an area being a run of
    ``N / area`` consecutive tokens; afterwards it permutes and copies the result and v back to
    ``[B, C, H, W]``. Here q, k, v are the channel-first split views of the conv output itself,
    the same numbers, and ``psa_attention(..., area=m.area)`` attends within the same runs, in
    place; its ``[B, heads, head_dim, N]`` result is ``[B, C, H, W]`` as a view. Where ``area``
    does not divide N it raises, as Ultralytics' reshape does.
    """
    B, _, H, W = x.shape
    N = H * W
    # 8.4 keeps this as m.all_head_dim; 8.3's AAttn has no such attribute (8.4 computes it so
    # for checkpoints pickled by 8.3).
    all_head_dim = m.num_heads * m.head_dim
    qkv = m.qkv(x)
    # Ultralytics' own views (area 1), which hold in either memory format of the conv output.
    q, k, v = (
        qkv.flatten(2).transpose(1, 2)
        .view(B, N, m.num_heads, m.head_dim * 3)
        .permute(0, 2, 3, 1)
        .split([m.head_dim, m.head_dim, m.head_dim], dim=2)
    )
    x = psa_attention(q, k, v, m.head_dim ** -0.5, area=m.area)
    x = x.view(B, all_head_dim, H, W)
    # v as an image for pe: one copy (Ultralytics makes two), in the conv output's memory
    # format, which pe's convolution (of the same model) then reads without converting it.
    channels_last = not qkv.is_contiguous() and qkv.is_contiguous(memory_format=torch.channels_last)
    v_image = torch.empty((B, all_head_dim, H, W), dtype=v.dtype, device=v.device,
                          memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    v_image.view(B, m.num_heads, m.head_dim, N).copy_(v)
    x = x + m.pe(v_image)
    return m.proj(x)


def runs_on_our_op(m: nn.MultiheadAttention, query, key, value, key_padding_mask, attn_mask,
                   is_causal) -> bool:
    """Whether a ``nn.MultiheadAttention`` call is one ``attention`` computes: no masks, no
    dropout in training, batch-first, as many keys as queries, one embedding size, no extra
    key / value biases."""
    return (key_padding_mask is None and attn_mask is None and not is_causal
            and query.dim() == 3 and query.shape == key.shape
            and value.shape[:2] == key.shape[:2]
            and m.batch_first and m._qkv_same_embed_dim and m.bias_k is None
            and m.bias_v is None and not m.add_zero_attn
            and not (m.training and m.dropout > 0.0))


def mha_forward(m: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor) -> tuple[torch.Tensor, None]:
    """``nn.MultiheadAttention`` (batch-first, no masks) with the attention on ``attention``:
    the in-projections, heads as token-major views, the out-projection. Returns
    ``(output, None)``: AIFI, the only caller patched, reads the output alone."""
    B, N, C = query.shape
    heads = m.num_heads
    w_q, w_k, w_v = m.in_proj_weight.chunk(3)
    b_q, b_k, b_v = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None,) * 3
    q, k, v = (F.linear(t, w, b).view(B, N, heads, C // heads).transpose(1, 2)
               for t, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))
    o = attention(q, k, v, (C // heads) ** -0.5)  # [B, heads, N, C / heads]
    return m.out_proj(o.transpose(1, 2).reshape(B, N, C)), None
