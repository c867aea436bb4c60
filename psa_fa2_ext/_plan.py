"""What a CUDA call runs, without running it: csrc/cuda/plan.h's plan_fwd / plan_bwd (the code
the ops run), asked about a call and a device description. Works in every build, GPU or not.

    python -m psa_fa2_ext --plan 16 4 1600 32 64 bf16 psa --device h100
"""
from __future__ import annotations

import torch

from . import _C
from .ops import _area_views, _new_output

# (compute capability major, minor, SMs, shared memory a CTA may opt in to, whether the Hopper
# wgmma kernels may run, whether the GPU runs this build's kernels at all: those of the default
# build, "8.0+PTX;9.0a")
DEVICES = {
    "h100": (9, 0, 132, 227 * 1024, True, True),
    "h200": (9, 0, 132, 227 * 1024, True, True),
    "a100": (8, 0, 108, 163 * 1024, False, True),
    "rtx3090": (8, 6, 82, 99 * 1024, False, True),
    "rtx4090": (8, 9, 128, 99 * 1024, False, True),
    "rtx5090": (12, 0, 170, 99 * 1024, False, True),
    "t4": (7, 5, 40, 64 * 1024, False, False),
}

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}

# How the inputs are laid out (see README): "psa" is the Ultralytics block's split views of one
# channel-first qkv conv output [B, H, dk + dk + dv, N]; "channel_first" separate [B, H, d, N]
# tensors; "token_major" separate [B, H, N, d] tensors.
LAYOUTS = ("psa", "channel_first", "token_major")


def current_device() -> tuple:
    """The visible GPU as the plan sees it (PSA_FA2_DISABLE_SM90 aside)."""
    major, minor = torch.cuda.get_device_capability()
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    built = "wgmma" in _C.build_info()["cuda_kernels"]
    return (major, minor, properties.multi_processor_count,
            properties.shared_memory_per_block_optin, built and (major, minor) == (9, 0),
            _C._current_device_runs_kernels())


def _desc(t: torch.Tensor) -> tuple:
    """(byte offset from an aligned base, strides of the logical [B, H, N, D] view)."""
    return (t.storage_offset() * t.element_size(), *t.stride())


def area_views(t: torch.Tensor, area: int) -> torch.Tensor:
    """A block view [B, H, D, N] of a contiguous tensor as the operators see it under
    psa_attention(..., area=area): [B * H, area, N / area, D], the runs as heads. (inputs()
    makes no channels_last views, whose runs go in the batch instead.)"""
    return _area_views(t, area, runs_in_batch=False).transpose(2, 3)


def inputs(batch, heads, seqlen, dk, dv, dtype, layout, device="meta", area=1):
    """q, k, v in the ops' logical [B, H, N, d] form, laid out as `layout` says; with area > 1
    ("psa" only), as psa_attention(..., area=area) hands them to the operators."""
    if area > 1 and layout != "psa":
        raise ValueError(f"area > 1 applies to the block's views (layout \"psa\"), got {layout!r}")
    if layout == "psa":
        qkv = torch.empty(batch, heads, 2 * dk + dv, seqlen, dtype=dtype, device=device)
        q, k, v = qkv.split([dk, dk, dv], dim=2)
        if area > 1:
            return tuple(area_views(t, area) for t in (q, k, v))
        return q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3)
    if layout == "channel_first":
        return tuple(torch.empty(batch, heads, d, seqlen, dtype=dtype, device=device)
                     .transpose(2, 3) for d in (dk, dk, dv))
    if layout == "token_major":
        return tuple(torch.empty(batch, heads, seqlen, d, dtype=dtype, device=device)
                     for d in (dk, dk, dv))
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def plan(direction, q, k, v, *, device, impl="auto", deterministic=False, allow_tf32=None,
         force=None, area=1):
    """(description, fields) of the plan of fwd(q, k, v) or of its backward, with the outputs
    and gradients the ops would allocate (psa_attention's backward writes one qkv gradient
    buffer where q, k, v are split views of one; `area`: as inputs(..., area) made them)."""
    batch, heads, seqlen, dk = q.shape
    dv = v.size(3)
    channel_first = q.stride(2) == 1 and seqlen > 1 and q.stride(3) != 1
    if allow_tf32 is None:
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    dtype = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
             torch.float16: "float16"}[q.dtype]
    out = _new_output(q.to("meta"), dv, "channel_first" if channel_first else "token_major")
    tensors = [q, k, v, out]
    if direction == "bwd":
        shared = q._base is not None and q._base is k._base and k._base is v._base
        if shared:
            # One qkv-shaped buffer, whatever the base's own shape ([B, H*C, N], [B, C, h, w],
            # ...), seen as [B, H, C, N] (area views: [B * H, 1, C, N]).
            grad = torch.empty(q._base.shape, dtype=q.dtype, device="meta")
            grad = grad.view(batch, heads, -1, seqlen) if area == 1 else \
                grad.view(batch, 1, -1, seqlen * area)
            dq, dk_, dv_ = (area_views(x, area) if area > 1 else x.transpose(2, 3)
                            for x in grad.split([dk, dk, dv], dim=2))
        else:
            dq, dk_, dv_ = (torch.empty_like(t, device="meta") for t in (q, k, v))
        tensors += [torch.empty_like(out), dq, dk_, dv_]
    return _C._plan(direction, dtype, channel_first, batch, heads, seqlen, dk, dv,
                    [_desc(t) for t in tensors], allow_tf32, deterministic, impl,
                    tuple(device), dict(force or {}))
