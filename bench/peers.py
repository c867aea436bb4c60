"""Every attention a PSA, AAttn or AIFI user could pick, behind one calling convention.

Each peer takes the views its block hands the attention and returns what the block goes on
with (layouts.py): for PSA and AAttn the channel-first split views of the qkv conv output
(q, k [B, H, dk, N], v [B, H, dv, N], stride of N == 1) and [B, H, dv, N] contiguous, so
that `.view(B, C, h, w)` is free as in the block; for AIFI the three [B, N, C] projections
viewed as heads [B, H, N, D] and [B, N, C] contiguous. Whatever layout copy a peer needs to
get there is part of the peer and so of its time and memory. AAttn's areas are runs of N:
peers other than ours and eager copy them to a batch of their own, [B * area, H, N / area, D].
"""
import contextlib
import dataclasses
from typing import Callable, List

import torch
import torch.nn.functional as F


class Unsupported(Exception):
    """The peer cannot run this case at all (dtype, device, missing package)."""


@dataclasses.dataclass
class Candidate:
    """One way to run a peer; the first candidate whose warm-up succeeds is measured."""
    fn: Callable
    note: str = ""
    context: Callable = contextlib.nullcontext  # entered once around all calls


@dataclasses.dataclass
class Case:
    dk: int
    dv: int
    scale: float
    dtype: torch.dtype
    device: torch.device
    block: str = "psa"   # layouts.BLOCKS
    area: int = 1        # aattn: equal runs of N that attend separately


def _tok_view(c, x):
    """The operand token-major, as a view: [B, H, N, D], or [B, area, H, N / area, D]."""
    if c.block == "aifi":
        return x   # the projection's own head view
    if c.area == 1:
        return x.transpose(-1, -2)
    return x.unflatten(3, (c.area, x.shape[3] // c.area)).permute(0, 3, 1, 4, 2)


def _batch(c, t):
    # [B, area, ...] (contiguous) -> [B * area, ...]: a view.
    return t.flatten(0, 1) if c.block == "aattn" and c.area > 1 else t


def _tok(c, x):
    # -> [B', H, N', D] with stride(-1) == 1, what fused kernels read: one copy from the
    # channel-first views, none from AIFI's head views.
    return x if c.block == "aifi" else _batch(c, _tok_view(c, x).contiguous())


def _out(c, o):
    """[B', H, N', dv] -> the layout the block goes on with (module docstring), contiguous."""
    if c.block == "aifi":
        return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)   # [B, N, C]
    if c.area == 1:
        return o.transpose(-1, -2).contiguous()
    o = o.unflatten(0, (o.shape[0] // c.area, c.area))                 # [B, area, H, N', dv]
    return o.permute(0, 2, 4, 1, 3).reshape(o.shape[0], o.shape[2], o.shape[4], -1)


def _pad_dim(c):
    # Flash-style kernels want one head dim for q, k and v, a multiple of 8. Zero columns
    # in q and k leave QK^T unchanged; zero columns in v only add output columns we drop.
    d = max(c.dk, c.dv)
    return (d + 7) // 8 * 8


def _pads(c):
    # True when the head dims differ or are not a multiple of 8, i.e. padding changes them.
    return _pad_dim(c) != c.dk or _pad_dim(c) != c.dv


def _need_cuda(c):
    if c.device.type != "cuda":
        raise Unsupported("CUDA only")


def _need_half(c):
    if c.dtype not in (torch.float16, torch.bfloat16):
        raise Unsupported("fp16/bf16 only")


def eager(c):
    if c.block == "aattn":
        return [Candidate(_eager_aattn(c))]
    if c.block == "aifi":
        return [Candidate(_eager_mha(c))]

    # The Ultralytics Attention block's three lines, verbatim.
    def run(q, k, v):
        attn = (q.transpose(-2, -1) @ k) * c.scale
        attn = attn.softmax(dim=-1)
        return v @ attn.transpose(-2, -1)
    return [Candidate(run)]


def _conv_output(q):
    # The tensor the split views were taken from: the qkv conv output [B, 3C, h, w], which
    # Ultralytics' AAttn reshapes itself.
    base = q._base
    if base is None or base.dim() != 4:
        raise Unsupported("eager AAttn needs the split views of a [B, 3C, h, w] conv output")
    return base


def _eager_aattn(c):
    # Ultralytics' AAttn.forward (8.4.x) from its qkv conv output to the [B, C, h, w] it adds
    # pe(v) to, verbatim: with area > 1 the copy to [B * area, N / area, 3C], and the copies
    # back. Its copy of v for pe is left out here, as for every peer: the patched block makes
    # it too.
    def run(q, _k, _v):
        qkv = _conv_output(q)
        B, _, h, w = qkv.shape
        N, heads, head_dim = h * w, q.shape[1], q.shape[2]
        qkv = qkv.flatten(2).transpose(1, 2)
        if c.area > 1:
            qkv = qkv.reshape(B * c.area, N // c.area, heads * head_dim * 3)
            B, N, _ = qkv.shape
        q, k, v = (qkv.view(B, N, heads, head_dim * 3).permute(0, 2, 3, 1)
                   .split([head_dim, head_dim, head_dim], dim=2))
        attn = (q * c.scale).transpose(-2, -1) @ k
        attn = attn.softmax(dim=-1)
        x = v @ attn.transpose(-2, -1)
        x = x.permute(0, 3, 1, 2)
        if c.area > 1:
            x = x.reshape(B // c.area, N * c.area, heads * head_dim)
            B, N, _ = x.shape
        x = x.reshape(B, h, w, heads * head_dim).permute(0, 3, 1, 2).contiguous()
        return x.view(B, heads, head_dim, N)
    return run


def _eager_mha(c):
    # nn.MultiheadAttention's path for AIFI's call (masks none, need_weights=True by default):
    # bmm, softmax, bmm on [B * H, N, D], and the head-averaged weights it returns (AIFI drops
    # them). MHA projects seq-first inputs, so its [B * H, N, D] are views of a copy made
    # before the projections; from the [B, N, C] projections here the copy comes after them.
    def run(q, k, v):
        B, H, N, _ = q.shape
        q, k, v = (x.reshape(B * H, N, x.shape[3]) for x in (q, k, v))
        w = torch.bmm(q * c.scale, k.transpose(-2, -1)).softmax(dim=-1)
        o = torch.bmm(w, v)
        w.view(B, H, N, N).mean(dim=1)   # MHA's returned weights: computed, then dropped
        return o.view(B, H, N, -1).transpose(1, 2).reshape(B, N, -1)
    return run


def _sdpa_native(c):
    def run(q, k, v):
        o = F.scaled_dot_product_attention(_tok(c, q), _tok(c, k), _tok(c, v), scale=c.scale)
        return _out(c, o)
    return run


def _tok_padded(c, q, k, v):
    # F.pad of the token-major view does the layout change and the padding in one copy.
    d = _pad_dim(c)
    views = [_tok_view(c, x) for x in (q, k, v)]
    return [_batch(c, F.pad(t, (0, d - t.shape[-1]))) for t in views]


def _sdpa_padded(c):
    def run(q, k, v):
        o = F.scaled_dot_product_attention(*_tok_padded(c, q, k, v), scale=c.scale)
        return _out(c, o[..., : c.dv])
    return run


def sdpa_auto(c):
    # What F.scaled_dot_product_attention picks by itself.
    return [Candidate(_sdpa_native(c))]


def _sdpa_forced(backend_name, c, padded_only=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def ctx():
        return sdpa_kernel(backend)
    pad_note = f"q,k,v zero-padded to head dim {_pad_dim(c)}"
    cands = [] if padded_only else [Candidate(_sdpa_native(c), "", ctx)]
    if padded_only or _pads(c):
        cands.append(Candidate(_sdpa_padded(c), pad_note, ctx))
    return cands


def sdpa_cudnn(c):
    _need_cuda(c)
    _need_half(c)
    return _sdpa_forced("CUDNN_ATTENTION", c)


def sdpa_efficient(c):
    _need_cuda(c)
    return _sdpa_forced("EFFICIENT_ATTENTION", c)


def sdpa_flash(c):
    # CUDA's flash kernel takes fp16 / bf16 only, the CPU one fp32 too. On a CPU, SDPA auto
    # picks that kernel only for equal head dims and runs the N x N math backend otherwise.
    if c.device.type == "cuda":
        _need_half(c)
    # Flash needs equal head dims: always the padded form, padding counted as its cost.
    return _sdpa_forced("FLASH_ATTENTION", c, padded_only=_pads(c))


_flex_compiled = None


def flex(c):
    _need_cuda(c)
    global _flex_compiled
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as e:
        raise Unsupported(f"no flex_attention: {e}")
    if _flex_compiled is None:
        import torch._dynamo.config as dcfg
        # One compiled entry per (shape, dtype, grad mode); the default limit of 8 would
        # silently fall back to the unfused eager flex and time that instead.
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(dcfg, name):
                setattr(dcfg, name, max(getattr(dcfg, name), 4096))
        _flex_compiled = torch.compile(flex_attention)
    fa = _flex_compiled

    def run(q, k, v):
        return _out(c, fa(_tok(c, q), _tok(c, k), _tok(c, v), scale=c.scale))

    def padded(q, k, v):
        return _out(c, fa(*_tok_padded(c, q, k, v), scale=c.scale)[..., : c.dv])
    # Default torch.compile: after the first shape it recompiles with dynamic shapes, which
    # keeps the whole matrix to a few compiles; compile time is excluded (warm-up).
    note = "torch.compile"
    cands = [Candidate(run, note)]
    if _pads(c):
        cands.append(Candidate(padded, f"{note}; q,k,v zero-padded to head dim {_pad_dim(c)}"))
    return cands


def _fa4_func():
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # noqa: BLE001 - any import failure means "not installed here"
        try:
            from flash_attn.cute.interface import flash_attn_func
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"flash_attn.cute not importable ({type(e).__name__}); "
                              "pip install flash-attn-4")
    return flash_attn_func


def fa4(c):
    _need_cuda(c)
    _need_half(c)
    func = _fa4_func()
    d = _pad_dim(c)

    def call(qt, kt, vt):
        r = func(qt, kt, vt, softmax_scale=c.scale)
        o = r[0] if isinstance(r, tuple) else r   # some releases also return lse
        return _out(c, o[..., : c.dv].transpose(1, 2))   # [B', N', H, D] -> the block's layout

    def bnhd(x):
        # [B', N', H, D], FA4's layout, as a view: AIFI's projections are that layout already.
        return x.transpose(1, 2) if c.block == "aifi" else _tok_view(c, x).transpose(-3, -2)

    def native(q, k, v):
        return call(*[_batch(c, bnhd(x).contiguous()) for x in (q, k, v)])

    def padded(q, k, v):
        return call(*[_batch(c, F.pad(bnhd(x), (0, d - bnhd(x).shape[-1]))) for x in (q, k, v)])
    cands = [Candidate(native)]
    if _pads(c):
        cands.append(Candidate(padded, f"q,k,v zero-padded to head dim {d}"))
    return cands


def _ours(impl):
    def build(c):
        try:
            import psa_fa2_ext
        except Exception as e:  # noqa: BLE001 - an unbuilt extension must not stop the peers
            raise Unsupported(f"psa_fa2_ext not importable: {type(e).__name__}: {e}")

        def run(q, k, v):
            if c.block == "aifi":   # as the patched AIFI's attention does (blocks.py)
                return _out(c, psa_fa2_ext.attention(q, k, v, c.scale, impl=impl))
            return psa_fa2_ext.psa_attention(q, k, v, c.scale, impl=impl, area=c.area)
        return [Candidate(run)]
    return build


# name -> (label, builder). Order is the row order of the tables.
PEERS = {
    "ours": ("psa_fa2_ext (auto)", _ours("auto")),
    "seed": ("psa_fa2_ext reference (seed)", _ours("reference")),
    "eager": ("eager Ultralytics math", eager),
    "sdpa": ("SDPA auto backend", sdpa_auto),
    "sdpa_cudnn": ("SDPA cuDNN", sdpa_cudnn),
    "sdpa_efficient": ("SDPA mem-efficient", sdpa_efficient),
    "sdpa_flash": ("SDPA flash", sdpa_flash),
    "flex": ("FlexAttention", flex),
    "fa4": ("FlashAttention-4", fa4),
}
OURS = ("ours", "seed")   # never "the best peer"
# (peer, mode) pairs timed from a CUDA graph. Only code known to capture cleanly: our
# extension (plain kernel launches on the current stream, torch-allocated buffers), and
# forward-only SDPA and eager ATen ops. Compiled (flex) and JIT (fa4) peers may recompile
# or sync, and a capture that fails mid-way is what poisoned the first GPU run. No
# fwd+bwd pair: autograd.grad under capture failed for ours (inputs made on the legacy
# stream), and one method for every fwd+bwd row keeps peer/ours a like-for-like ratio.
# Everything not listed is timed by the profiler's kernel sum (timing.kernel_time).
GRAPH_SAFE = {("ours", "fwd"), ("seed", "fwd"), ("eager", "fwd"), ("sdpa", "fwd"),
              ("sdpa_cudnn", "fwd"), ("sdpa_efficient", "fwd"), ("sdpa_flash", "fwd")}
GPU_DEFAULT = list(PEERS)
# Every peer that runs on a CPU. Not "seed": the reference kernel (one thread per query row
# on the GPU) is a GPU yardstick; on the CPU it is just another slow loop.
CPU_DEFAULT = ["ours", "eager", "sdpa", "sdpa_flash"]


def build(name, case) -> List[Candidate]:
    return PEERS[name][1](case)
