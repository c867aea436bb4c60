"""Python surface of torch.ops.psa_fa2: typed wrappers, fake (meta) kernels, autograd and
autocast registrations.

Logical shapes follow the operators: q, k are [B, H, N, dk] and v is [B, H, N, dv], either
token-major (stride(-1) == 1) or channel-first (stride(-2) == 1, the PSA views).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (importing it registers torch.ops.psa_fa2)

__all__ = ["fwd", "bwd", "attention", "psa_attention"]

_IMPLS = ("auto", "fast", "reference")


def fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """Attention forward: ``out = softmax(scale * q @ k^T) @ v`` and the row logsumexp.

    Args:
        q, k: ``[B, H, N, dk]``; v: ``[B, H, N, dv]``; one dtype (float64, float32, bfloat16,
            float16), one device, and one layout, token-major or channel-first.
        scale: the softmax scale.
        impl: ``"auto"`` (fast kernel where one exists), ``"fast"`` (error if none) or
            ``"reference"`` (CUDA: the one-CTA-per-row kernel; CPU: blockwise ``at::matmul``).
            On the CPU the fast kernels are the fused tile kernels (float32, bfloat16,
            float16); float64 runs blockwise.

    Returns:
        ``out`` ``[B, H, N, dv]`` in the inputs' layout and ``lse`` ``[B, H, N]`` (natural
        log; float32, float64 for float64 inputs).
    """
    return torch.ops.psa_fa2.fwd(q, k, v, scale, impl)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
        dq: Tensor, dk: Tensor, dv: Tensor, impl: str = "auto", deterministic: bool = False,
        accumulate: bool = True) -> None:
    """Attention backward, in place: ``dq += dL/dq``, ``dk += dL/dk``, ``dv = dL/dv``.

    dq and dk are accumulated so that two calls on the halves of V (with the matching
    halves of ``out`` and ``dout`` and their own ``lse``) add up to the full-V gradient;
    ``accumulate=False`` overwrites them instead (``dq = dL/dq``, ``dk = dL/dk``), so they
    need not be zero-filled. ``deterministic=True`` (or
    ``torch.use_deterministic_algorithms(True)``) gives bit-identical results run to run.
    """
    torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, impl, deterministic,
                          accumulate)


# --- layouts -----------------------------------------------------------------------------
# The rules of csrc/layout.h, stated again for the fake kernels and the compiled autograd:
# they run on symbolic shapes, which the C++ helpers cannot read. tests/test_layout_rules.py
# checks that both give the same answers.

def _token_major(t: Tensor) -> bool:
    return t.numel() == 0 or t.size(3) <= 1 or t.stride(3) == 1


def _channel_first(t: Tensor) -> bool:
    return t.numel() == 0 or t.size(2) <= 1 or t.stride(2) == 1


def _common_layout(*ts: Tensor) -> str | None:
    """The layout the operators pick for these tensors (csrc/layout.h: shared_layout)."""
    if all(_token_major(t) for t in ts):
        return "token_major"
    if all(_channel_first(t) for t in ts):
        return "channel_first"
    return None


def _new_in_layout(like: Tensor, d: int, layout: str) -> Tensor:
    B, H, N = like.shape[:3]
    if layout == "token_major":
        return torch.empty(B, H, N, d, dtype=like.dtype, device=like.device)
    return torch.empty(B, H, d, N, dtype=like.dtype, device=like.device).transpose(2, 3)


def _new_output(q: Tensor, d: int, layout: str) -> Tensor:
    """The forward's output for inputs like q (csrc/layout.h: empty_output_like): heads inside
    the head dim (channel-first area views) or inside the tokens (token-major head views of a
    projection) where q has them there."""
    B, H, N = q.shape[:3]
    if H > 1 and N > 1 and q.shape[3] > 1:
        if layout == "channel_first" and q.stride(1) < q.stride(3):
            return q.new_empty(B, d, H, N).permute(0, 2, 3, 1)
        if layout == "token_major" and q.stride(1) < q.stride(2):
            return q.new_empty(B, N, H, d).transpose(1, 2)
    return _new_in_layout(q, d, layout)


def _area_runs_in_batch(t: Tensor) -> bool:
    """Where psa_attention puts the runs of an area of block view t ([B, H, D, N]), by the rule
    of csrc/autograd/psa_attention.cpp (area_runs_of): in the batch where (b, run) merge and
    (b, h) do not (the views of a channels_last conv output), else as heads."""
    B, H, _, N = t.shape
    bh_merge = B == 1 or H == 1 or t.stride(0) == H * t.stride(1)
    return not bh_merge and t.stride(0) == N * t.stride(3)


def _area_views(t: Tensor, area: int, runs_in_batch: bool) -> Tensor:
    """Block view t ([B, H, D, N]) as its area views: [B * area, H, D, N / area] with the runs
    in the batch, else [B * H, area, D, N / area]; views where those dims merge."""
    run = t.shape[3] // area
    if runs_in_batch:
        return t.unflatten(3, (area, run)).permute(0, 3, 1, 2, 4).flatten(0, 1)
    return t.flatten(0, 1).unflatten(2, (area, run)).transpose(1, 2)


def _from_area_views(t: Tensor, B: int, H: int, area: int, runs_in_batch: bool) -> Tensor:
    """The inverse of _area_views for a result: -> [B, H, dv, N]."""
    if runs_in_batch:
        t = t.unflatten(0, (B, area)).permute(0, 2, 3, 1, 4)
    else:
        t = t.transpose(1, 2)
    return t.reshape(B, H, t.shape[2], -1)


def _to_layout(t: Tensor, layout: str) -> Tensor:
    if layout == "token_major":
        return t if _token_major(t) else t.contiguous()
    return t if _channel_first(t) else t.transpose(2, 3).contiguous().transpose(2, 3)


# --- fake kernels (meta tensors, torch.compile) -------------------------------------------

@torch.library.register_fake("psa_fa2::fwd")
def _fwd_fake(q, k, v, scale, impl="auto"):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                 lambda: "q, k and v must be 4-d [B, H, N, D]")
    torch._check(k.shape == q.shape, lambda: f"k must have the shape of q {tuple(q.shape)}")
    torch._check(v.shape[:3] == q.shape[:3], lambda: "v must share [B, H, N] with q")
    torch._check(impl in _IMPLS, lambda: f"impl must be one of {_IMPLS}, got {impl!r}")
    layout = _common_layout(q, k, v)
    torch._check(layout is not None, lambda: "q, k and v must share one layout")
    out = _new_output(q, v.shape[3], layout)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = q.new_empty(q.shape[:3], dtype=lse_dtype)
    return out, lse


@torch.library.register_fake("psa_fa2::bwd")
def _bwd_fake(dout, q, k, v, out, lse, scale, dq, dk, dv, impl="auto", deterministic=False,
              accumulate=True):
    torch._check(dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape,
                 lambda: "dq, dk and dv must have the shapes of q, k and v")


# --- autograd ------------------------------------------------------------------------------
# The autograd formula is stated twice, on purpose: in C++ (csrc/autograd/psa_attention.cpp),
# which eager calls reach in one dispatcher call with one node per step (the host cost of a
# training step at YOLO shapes), and here on the fwd op, which torch.compile can trace (it
# cannot trace into a C++ autograd node). Both call the same fwd / bwd operators;
# tests/test_autograd_paths.py checks that their outputs and gradients agree.

def _fwd_setup_context(ctx, inputs, output):
    q, k, v, scale, impl = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale
    ctx.impl = impl


def _fwd_backward(ctx, dout, _dlse):
    # bwd has no derivative: with create_graph=True its gradients would come back as
    # constants and a second-order term silently vanish (psa_attention.cpp says the same).
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError("psa_fa2 attention's backward is not differentiable: create_graph=True "
                           "(double backward) through it is not supported")
    q, k, v, out, lse = ctx.saved_tensors
    layout = _common_layout(q, k, v, out)
    dout = _to_layout(dout, layout)
    # Each gradient with its operand's heads where the operand has them (_new_output's rule),
    # so that autograd's view back to the operand's base is free.
    dq, dk, dv = (_new_output(t, t.shape[3], layout) for t in (q, k, v))
    torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, ctx.scale, dq, dk, dv, ctx.impl,
                          torch.are_deterministic_algorithms_enabled(), False)
    return dq, dk, dv, None, None


torch.library.register_autograd("psa_fa2::fwd", _fwd_backward, setup_context=_fwd_setup_context)


# --- autocast: like matmul, float32 inputs run in the autocast dtype ------------------------

def _register_autocast(device_type: str, dispatch_key: str) -> None:
    key = getattr(torch._C.DispatchKey, dispatch_key)

    def cast(t):
        dtype = torch.get_autocast_dtype(device_type)
        return t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t

    def fwd_autocast(q, k, v, scale, impl="auto"):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return torch.ops.psa_fa2.fwd(cast(q), cast(k), cast(v), scale, impl)

    def psa_attention_autocast(q, k, v, scale, impl="auto", area=1):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return torch.ops.psa_fa2.psa_attention(cast(q), cast(k), cast(v), scale, impl, area)

    def attention_autocast(q, k, v, scale, impl="auto"):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return torch.ops.psa_fa2.attention(cast(q), cast(k), cast(v), scale, impl)

    _autocast_lib.impl("fwd", fwd_autocast, dispatch_key)
    _autocast_lib.impl("psa_attention", psa_attention_autocast, dispatch_key)
    _autocast_lib.impl("attention", attention_autocast, dispatch_key)


_autocast_lib = torch.library.Library("psa_fa2", "IMPL")
_register_autocast("cuda", "AutocastCUDA")
_register_autocast("cpu", "AutocastCPU")


# --- user-facing functions ------------------------------------------------------------------

def _default_scale(scale: float | None, dk: int) -> float:
    return dk ** -0.5 if scale is None else float(scale)


def _check_rank(t: Tensor, name: str, dims: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be a 4-d tensor {dims}, got {t.dim()}-d with shape "
                         f"{list(t.shape)}")


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, *,
              impl: str = "auto") -> Tensor:
    """Token-major attention, like ``F.scaled_dot_product_attention`` without masks.

    Args:
        q, k: ``[B, H, N, dk]``; v: ``[B, H, N, dv]`` (dk, dv <= 256).
        scale: softmax scale, default ``dk ** -0.5``.
        impl: ``"auto"``, ``"fast"`` or ``"reference"`` (see :func:`fwd`).

    Returns:
        ``[B, H, N, dv]``. Differentiable in q, k and v.
    """
    for t, name, dims in ((q, "q", "[B, H, N, dk]"), (k, "k", "[B, H, N, dk]"),
                          (v, "v", "[B, H, N, dv]")):
        _check_rank(t, name, dims)
    scale = _default_scale(scale, q.shape[-1])
    if not torch.compiler.is_compiling():
        # One call into C++ (psa_attention.cpp), whose autograd node calls the operators
        # directly; the fwd op's own autograd (above) is Python.
        return torch.ops.psa_fa2.attention.default(q, k, v, scale, impl)
    # Traced: the fwd op, whose fake kernel and Python autograd torch.compile can follow.
    if _common_layout(q, k, v) is None:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return torch.ops.psa_fa2.fwd(q, k, v, scale, impl)[0]


def psa_attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, *,
                  impl: str = "auto", area: int = 1) -> Tensor:
    """Channel-first attention: exactly the Ultralytics ``Attention`` block's math, and with
    ``area > 1`` YOLO12's area attention (``AAttn``).

    Computes ``v @ softmax(scale * q^T @ k)^T``; with ``area > 1``, within each of ``area``
    equal runs of N separately (tokens ``[i * N / area, (i + 1) * N / area)``), which is what
    ``AAttn`` computes after its reshape to ``[B * area, N / area, 3C]``.

    Args:
        q, k: ``[B, H, dk, N]``; v: ``[B, H, dv, N]``, e.g. the views of
            ``qkv.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)``, read in place.
        scale: softmax scale, default ``dk ** -0.5``.
        impl: ``"auto"``, ``"fast"`` or ``"reference"`` (see :func:`fwd`).
        area: how many equal runs of N attend separately; must divide N.

    Returns:
        ``[B, H, dv, N]``, contiguous, so ``.view(B, H * dv, h, w)`` is free. Differentiable;
        when q, k and v are exactly the split views of one tensor, the backward writes that
        tensor's gradient in one buffer (no per-view gradients, no copies). With ``area > 1``
        such views are read in place too.
    """
    for t, name, dims in ((q, "q", "[B, H, dk, N]"), (k, "k", "[B, H, dk, N]"),
                          (v, "v", "[B, H, dv, N]")):
        _check_rank(t, name, dims)
    if isinstance(area, bool) or not isinstance(area, int) or area < 1:
        raise ValueError(f"area must be an int >= 1, got {area!r}")
    scale = _default_scale(scale, q.shape[2])
    if not torch.compiler.is_compiling():
        # One call into C++ (psa_attention.cpp): the autograd node, the layout handling and,
        # on the split views of one tensor, the single gradient buffer all live there.
        return torch.ops.psa_fa2.psa_attention.default(q, k, v, scale, impl, area)
    # Traced: the fwd op, whose fake kernel and Python autograd torch.compile can follow, on the
    # area views psa_attention.cpp makes, by its rule, so that both read the conv output in
    # place: a contiguous one's runs become heads, a channels_last one's join the batch.
    B, H, _, N = q.shape
    runs_in_batch = area > 1 and _area_runs_in_batch(q)
    if area > 1:
        # Dynamo takes a message closure over constants only, and both N and area may be
        # symbolic (torch 2.11 makes an int argument that changes between calls symbolic), so
        # the message names no values; the eager path's C++ check does.
        torch._check(N % area == 0,
                     lambda: "psa_attention: area must divide the sequence length N (q.shape[3])")
        q, k, v = (_area_views(t, area, runs_in_batch) for t in (q, k, v))
    qt, kt, vt = q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3)
    if _common_layout(qt, kt, vt) is None:
        qt, kt, vt = (t.contiguous().transpose(2, 3) for t in (q, k, v))
    out = torch.ops.psa_fa2.fwd(qt, kt, vt, scale, impl)[0].transpose(2, 3)
    if area > 1:
        out = _from_area_views(out, B, H, area, runs_in_batch)
    return out.contiguous()
