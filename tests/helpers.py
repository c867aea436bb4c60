"""Shared helpers: inputs in both layouts, the float64 reference, error measures, and the
forward / backward checks that the CPU, reference-kernel and fast-kernel tests all run."""
from __future__ import annotations

import pytest
import torch

import psa_fa2_ext  # noqa: F401  (registers torch.ops.psa_fa2)
from psa_fa2_ext.reference import attention_eager, lse_eager

HAS_CUDA = torch.cuda.is_available() and psa_fa2_ext.build_info()["cuda"]
CUDA_SKIP_REASON = (
    "no CUDA GPU visible" if not torch.cuda.is_available()
    else "psa_fa2_ext was built without CUDA kernels"
)
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)
# For tests that run on the CPU and, where there is one, the GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

SEQLENS = [1, 7, 49, 97, 400, 1025]
HEAD_DIMS = [(16, 16), (32, 32), (32, 64), (64, 64), (64, 128)]
LAYOUTS = ["channel_first", "token_major"]


def batch_heads(n: int) -> tuple[int, int]:
    """Small problems get more heads (more chances to catch an indexing bug), large ones
    fewer (test time). The fewest keys get the most: with N = 7 the largest error of a
    gradient is the largest of only a few hundred elements, for ours and for the eager math
    alike, and the spread of that statistic alone puts their ratio past 2 now and then (2.66
    once in 100 draws of (2, 3) heads on the H200, 1.64 at most with (4, 8): measured at 5bb34ec;
    git history: bench/results/h200-2026-12-01-5bb34ec at 28fac21)."""
    if n <= 64:
        return (4, 8)
    return (2, 3) if n <= 400 else (1, 2)


def make_qkv(B, H, N, dk, dv, dtype, device, layout, requires_grad=False):
    """One qkv tensor, as the PSA block's conv makes it, and q, k, v as logical
    [B, H, N, D] views of it.

    channel_first: qkv is [B, H*(2dk+dv), N] and the views have stride(-2) == 1 (the
    Ultralytics `split` views); token_major: qkv is [B, H, N, 2dk+dv], stride(-1) == 1.
    """
    C = 2 * dk + dv
    if layout == "channel_first":
        qkv = torch.randn(B, H * C, N, dtype=dtype, device=device, requires_grad=requires_grad)
        q, k, v = qkv.view(B, H, C, N).split([dk, dk, dv], dim=2)
        q, k, v = (t.transpose(2, 3) for t in (q, k, v))
    else:
        qkv = torch.randn(B, H, N, C, dtype=dtype, device=device, requires_grad=requires_grad)
        q, k, v = qkv.split([dk, dk, dv], dim=3)
    return qkv, q, k, v


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|, in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


# Absolute floor for the "2x the same-precision eager error" rule, relative to max |ref|:
# at N = 1 both results can be exact, and 2 * 0 leaves no room for a last-bit tie.
_HALF_FLOOR = 1e-6


def assert_close_to_reference(name, ours, ref64, eager_same_precision, dtype, tf32=False):
    """Passes when ours is within the dtype's tolerance of the float64 reference:
    fp64 1e-10, fp32 1e-5 relative, bf16 / fp16 at most 2x the error of the same math run
    eagerly in that precision; fp32 with tf32=True (lse only: out has
    assert_within_tf32_rounding), at most 2x the error of the eager math on TF32-rounded
    operands (lse_reference_tf32)."""
    err = rel_err(ours, ref64)
    if dtype == torch.float64:
        tol = 1e-10
    elif dtype == torch.float32 and not tf32:
        tol = 1e-5
    else:
        tol = 2 * rel_err(eager_same_precision, ref64) + _HALF_FLOOR
    assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.3e}"


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits, to nearest with ties away from zero (as
    cvt.rna.tf32.f32); inf and NaN pass through."""
    bits = (x.view(torch.int32) + 0x1000) & -0x2000
    return torch.where(torch.isfinite(x), bits.view(torch.float32), x)


def lse_reference_tf32(q, k, scale):
    """float64 reference lse, and the eager one on TF32 operands (q, k rounded, S = q k^T in
    fp32). TF32 products of TF32 values are exact, so this does not depend on what cuBLAS
    runs."""
    q32, k32 = (round_to_tf32(t.float()) for t in (q, k))
    lse = ((q32 @ k32.transpose(-2, -1)) * scale).logsumexp(dim=-1)
    return lse_eager(q.double(), k.double(), scale), lse


# TF32 keeps 10 mantissa bits: rounding to nearest moves a value by at most 2^-11 of it.
TF32_UNIT_ROUNDOFF = 2.0 ** -11


def assert_within_tf32_rounding(out, q, k, v, scale):
    """out of the TF32 kernel against float64 attention on the same TF32 operands (q, k, v
    rounded to nearest, as the kernel rounds them), which leaves the rounding of the
    probabilities for P V (and fp32 arithmetic, far smaller). The eager math on those operands
    has that rounding too, so:
      - the root-mean-square error is at most 1.25x the eager one's. On the H200 that ratio
        stayed at 0.51-1.00 over some 3500 draws of the tests' cases, while an operand
        truncated or left unrounded, or P truncated, puts it at 1.4-2.7 (CPU emulation);
      - every element is within 1.25 u sum_j P_ij |v_jc| (u = 2^-11), the most that rounding
        the probabilities can move it, whatever max the kernel subtracts from the scores
        (0.87 u sum_j P_ij |v_jc| at most in those draws, at N = 7).
    Not "max error at most 2x the eager one", as for bf16 / fp16: the two errors are alike in
    distribution, and the ratio of their maxima passed 2 in 6 of 4000 draws on the H200, as
    often at 4 x 8 batches x heads as at 1 x 2 (measured at dbe9caf;
    git history: bench/results/h200-2026-12-04-dbe9caf at 28fac21)."""
    q32, k32, v32 = (round_to_tf32(t.float()) for t in (q, k, v))
    s = (q32 @ k32.transpose(-2, -1)) * scale
    eager = round_to_tf32(s.softmax(dim=-1)) @ v32
    p = ((q32.double() @ k32.double().transpose(-2, -1)) * scale).softmax(dim=-1)
    ref = p @ v32.double()
    err = (out.double() - ref).abs()
    floor = 2.0 ** -24 * ref.abs().max().item()  # both exact, as at N = 1
    rms, rms_eager = (x.square().mean().sqrt().item() for x in (err, eager.double() - ref))
    assert rms <= 1.25 * rms_eager + floor, (
        f"out: root-mean-square error {rms:.3e} > 1.25x the eager TF32 math's {rms_eager:.3e}")
    reach = TF32_UNIT_ROUNDOFF * (p @ v32.double().abs())
    past = ~(err <= 1.25 * reach + floor)  # NaN counts
    assert not bool(past.any()), (
        f"out: {int(past.sum())} of {err.numel()} elements past 1.25 u sum_j P_ij |v_jc|, the "
        f"worst at {(err / reach.clamp_min(1e-300)).max().item():.2f} u sum_j P_ij |v_jc|")


def assert_lse_close(lse, q, k, scale):
    ref = lse_eager(q.double(), k.double(), scale)
    tol = 1e-10 if q.dtype == torch.float64 else 1e-5
    err = ((lse.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err <= tol, f"lse: relative error {err:.3e} > {tol:.1e}"


def poison_cuda_allocator(nbytes: int, device) -> None:
    """Leaves a freed block of NaN bytes (0xFF is NaN in fp16, bf16, fp32 and fp64) in the
    caching allocator, so outputs the op allocates next start as NaN and any element the
    kernel forgets to write shows up."""
    block = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device)
    del block


def forward_reference(q, k, v, scale):
    """float64 reference output and the eager result in the inputs' own precision."""
    ref64 = attention_eager(q.double(), k.double(), v.double(), scale)
    eager = attention_eager(q, k, v, scale)
    return ref64, eager


def grads_reference(q, k, v, scale, dout):
    """float64 reference gradients (dq, dk, dv) and the eager ones in the inputs' precision."""
    def grads(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention_eager(*leaves, scale)
        return torch.autograd.grad(out, leaves, dout.to(dtype))
    return grads(torch.float64), grads(q.dtype)


def assert_zero_softmax_gradient(dq, dk, q, k, v, dout, scale):
    """With one key, P = 1 and dS = dP - rowsum(dO * O) is 0 exactly, so dq and dk are 0;
    a relative error against 0 means nothing. What is left must be rounding: a few ulps of
    the accumulation type times the size of the dP * K terms that cancelled."""
    eps = torch.finfo(torch.float64 if q.dtype == torch.float64 else torch.float32).eps
    dp = (dout.double().abs() * v.double().abs()).sum(-1).max()
    bound = 16 * eps * scale * dp * max(q.double().abs().max(), k.double().abs().max())
    for name, g in (("dq", dq), ("dk", dk)):
        assert g.double().abs().max() <= bound, f"{name} must be ~0 at N = 1, got {g.abs().max()}"


def check_forward(device, impl, N, dk, dv, dtype, layout, heads=None):
    """heads: (B, H), else batch_heads(N)."""
    B, H = heads or batch_heads(N)
    _, q, k, v = make_qkv(B, H, N, dk, dv, dtype, device, layout)
    scale = dk ** -0.5
    if device == "cuda":
        poison_cuda_allocator(4 * B * H * N * (dv + 1) * 8, device)
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, impl)
    assert out.shape == (B, H, N, dv) and out.dtype == dtype
    # The output keeps the inputs' layout: channel-first feeds .view(B, C, h, w) for free.
    if layout == "channel_first":
        assert out.transpose(2, 3).is_contiguous()
    else:
        assert out.is_contiguous()
    ref64, eager = forward_reference(q, k, v, scale)
    assert_close_to_reference("out", out, ref64, eager, dtype)
    assert_lse_close(lse, q, k, scale)


def check_backward(device, impl, N, dk, dv, dtype, layout, deterministic=False, heads=None):
    """heads: (B, H), else batch_heads(N)."""
    B, H = heads or batch_heads(N)
    _, q, k, v = make_qkv(B, H, N, dk, dv, dtype, device, layout)
    scale = dk ** -0.5
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, impl)
    dout = torch.randn_like(out)
    # dq / dk are accumulated into: start from random values and subtract them after
    # (from zeros in bf16 / fp16, where adding to O(1) values would round the gradient away).
    start = torch.randn_like if dtype in (torch.float64, torch.float32) else torch.zeros_like
    dq0, dk0 = start(q), start(k)
    dq, dk = dq0.clone(), dk0.clone()
    dv_ = torch.full_like(v, float("nan"))  # overwritten: every element must be written
    torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq, dk, dv_, impl, deterministic)
    (rq, rk, rv), (eq, ek, ev) = grads_reference(q, k, v, scale, dout)
    if N == 1:
        assert_zero_softmax_gradient(dq - dq0, dk - dk0, q, k, v, dout, scale)
    else:
        assert_close_to_reference("dq", dq.double() - dq0.double(), rq, eq, dtype)
        assert_close_to_reference("dk", dk.double() - dk0.double(), rk, ek, dtype)
    assert_close_to_reference("dv", dv_, rv, ev, dtype)
    # accumulate=False overwrites dq and dk: NaN-filled buffers must come back as the gradient.
    dq_o, dk_o, dv_o = (torch.full_like(t, float("nan")) for t in (q, k, v))
    torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq_o, dk_o, dv_o, impl, deterministic,
                          False)
    if N == 1:
        assert_zero_softmax_gradient(dq_o, dk_o, q, k, v, dout, scale)
    else:
        assert_close_to_reference("dq (accumulate=False)", dq_o, rq, eq, dtype)
        assert_close_to_reference("dk (accumulate=False)", dk_o, rk, ek, dtype)
    assert_close_to_reference("dv (accumulate=False)", dv_o, rv, ev, dtype)
