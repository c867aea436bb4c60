"""Forward and backward against the float64 reference, on CPU and on the CUDA reference
kernels, in both layouts."""
import pytest
import torch

from helpers import (HEAD_DIMS, LAYOUTS, SEQLENS, assert_close_to_reference, assert_lse_close,
                     assert_zero_softmax_gradient,
                     batch_heads, forward_reference, grads_reference, make_qkv,
                     poison_cuda_allocator, requires_cuda)

CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def check_forward(device, impl, N, dk, dv, dtype, layout):
    B, H = batch_heads(N)
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


matrix = pytest.mark.parametrize("N", SEQLENS)
dims = pytest.mark.parametrize("dk,dv", HEAD_DIMS, ids=[f"{a}x{b}" for a, b in HEAD_DIMS])
layouts = pytest.mark.parametrize("layout", LAYOUTS)


@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_forward_cpu(N, dk, dv, dtype, layout):
    check_forward("cpu", "auto", N, dk, dv, dtype, layout)


@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_backward_cpu(N, dk, dv, dtype, layout):
    check_backward("cpu", "auto", N, dk, dv, dtype, layout)


@requires_cuda
@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_forward_cuda_reference(N, dk, dv, dtype, layout):
    check_forward("cuda", "reference", N, dk, dv, dtype, layout)


@requires_cuda
@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_backward_cuda_reference(N, dk, dv, dtype, layout):
    check_backward("cuda", "reference", N, dk, dv, dtype, layout)


@requires_cuda
@pytest.mark.parametrize("N", [1025, 4097])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_reference_fp32_long(N, layout):
    """fp32 reference kernels agree with float64 within 1e-5 relative up to N = 4097."""
    check_forward("cuda", "reference", N, 32, 64, torch.float32, layout)
    check_backward("cuda", "reference", N, 32, 64, torch.float32, layout)
