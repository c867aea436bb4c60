"""Every attention a PSA user could pick, behind one calling convention.

Each peer takes the Ultralytics split views (q, k [B, H, dk, N], v [B, H, dv, N], stride
of N == 1) and returns [B, H, dv, N] contiguous, so that `.view(B, C, h, w)` is free as
in the block. Whatever layout copy a peer needs to get there is part of the peer and so
of its time and memory.
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


def _tok(x):
    # [B, H, D, N] view -> [B, H, N, D] contiguous: stride(-1) == 1 is what fused kernels read.
    return x.transpose(-1, -2).contiguous()


def _chan(o):
    # [B, H, N, D] -> [B, H, D, N] contiguous, the layout the block's next line views.
    return o.transpose(-1, -2).contiguous()


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
    # The Ultralytics Attention block's three lines, verbatim.
    def run(q, k, v):
        attn = (q.transpose(-2, -1) @ k) * c.scale
        attn = attn.softmax(dim=-1)
        return v @ attn.transpose(-2, -1)
    return [Candidate(run)]


def _sdpa_native(c):
    def run(q, k, v):
        o = F.scaled_dot_product_attention(_tok(q), _tok(k), _tok(v), scale=c.scale)
        return _chan(o)
    return run


def _tok_padded(c, q, k, v):
    # F.pad of the transposed view does the layout change and the padding in one copy.
    d = _pad_dim(c)
    return [F.pad(x.transpose(-1, -2), (0, d - x.shape[2])).contiguous() for x in (q, k, v)]


def _sdpa_padded(c):
    def run(q, k, v):
        o = F.scaled_dot_product_attention(*_tok_padded(c, q, k, v), scale=c.scale)
        return _chan(o[..., : c.dv])
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
        return _chan(fa(_tok(q), _tok(k), _tok(v), scale=c.scale))

    def padded(q, k, v):
        return _chan(fa(*_tok_padded(c, q, k, v), scale=c.scale)[..., : c.dv])
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
        return o.permute(0, 2, 3, 1)[:, :, : c.dv].contiguous()   # [B, N, H, D] -> [B, H, dv, N]

    def native(q, k, v):
        bnhd = [x.permute(0, 3, 1, 2).contiguous() for x in (q, k, v)]
        return call(*bnhd)

    def padded(q, k, v):
        bnhd = [F.pad(x.permute(0, 3, 1, 2), (0, d - x.shape[2])).contiguous() for x in (q, k, v)]
        return call(*bnhd)
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
            return psa_fa2_ext.psa_attention(q, k, v, c.scale, impl=impl)
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
