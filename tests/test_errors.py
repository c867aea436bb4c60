"""Bad input gets a clear error naming the argument, what was expected and what came."""
import pytest
import torch

import psa_fa2_ext
from helpers import DEVICES, requires_cuda


def qkv(device, B=2, H=2, N=10, dk=8, dv=16, dtype=torch.float32):
    return (torch.randn(B, H, N, dk, dtype=dtype, device=device),
            torch.randn(B, H, N, dk, dtype=dtype, device=device),
            torch.randn(B, H, N, dv, dtype=dtype, device=device))


def fwd(q, k, v, impl="auto"):
    return torch.ops.psa_fa2.fwd(q, k, v, 0.5, impl)


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_rank(device):
    q, k, v = qkv(device)
    with pytest.raises(RuntimeError, match=r"q must be a 4-d tensor \[B, H, N, dk\], got 3-d"):
        fwd(q[0], k, v)
    with pytest.raises(ValueError, match=r"v must be a 4-d tensor \[B, H, dv, N\], got 5-d"):
        psa_fa2_ext.psa_attention(q, k, v[None])
    with pytest.raises(RuntimeError, match=r"k must be a 4-d tensor \[B, H, dk, N\], got 3-d"):
        torch.ops.psa_fa2.psa_attention(q, k[0], v, 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("what,index", [("B", 0), ("H", 1), ("N", 2), ("dk", 3)])
def test_mismatched_dims(device, what, index):
    q, k, v = qkv(device)
    shape = list(k.shape)
    shape[index] += 1
    k_bad = torch.randn(shape, device=device)
    with pytest.raises(RuntimeError, match=r"k must have shape \[2, 2, 10, 8\]"):
        fwd(q, k_bad, v)
    if index < 3:
        shape = list(v.shape)
        shape[index] += 1
        with pytest.raises(RuntimeError, match=r"v must have shape \[2, 2, 10, dv\]"):
            fwd(q, k, torch.randn(shape, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes(device):
    q, k, v = qkv(device)
    with pytest.raises(RuntimeError, match=r"v must have the dtype of q \(Float\), got Double"):
        fwd(q, k, v.double())


@requires_cuda
def test_mixed_devices():
    q, k, v = qkv("cuda")
    with pytest.raises(RuntimeError, match=r"k must be on the device of q \(cuda:0\), got cpu"):
        fwd(q, k.cpu(), v)


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_too_large(device):
    q, k, v = qkv(device, dk=257)
    with pytest.raises(RuntimeError, match=r"head dim \(dk\) must be in \[1, 256\], got 257"):
        fwd(q, k, v)
    q, k, v = qkv(device, dv=300)
    with pytest.raises(RuntimeError, match=r"head dim \(dv\) must be in \[1, 256\], got 300"):
        fwd(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_dtype(device):
    q, k, v = (t.to(torch.int32) for t in qkv(device))
    with pytest.raises(RuntimeError, match=r"q must be float64, float32, bfloat16 or float16, got Int"):
        fwd(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_layouts(device):
    q, k, v = qkv(device)
    k_cf = k.transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(RuntimeError, match=r"share one layout.*k: channel-first"):
        fwd(q, k_cf, v)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_impl(device):
    with pytest.raises(RuntimeError, match=r"impl must be \"auto\", \"fast\" or \"reference\", got \"quick\""):
        fwd(*qkv(device), impl="quick")


def test_fast_impl_on_cpu_needs_a_fused_dtype():
    with pytest.raises(RuntimeError, match=r"impl=\"fast\" on the CPU needs float32, bfloat16 or "
                                           r"float16 inputs, got Double"):
        fwd(*qkv("cpu", dtype=torch.float64), impl="fast")


@pytest.mark.parametrize("device", DEVICES)
def test_bad_backward_buffers(device):
    q, k, v = qkv(device)
    out, lse = fwd(q, k, v)
    dout = torch.randn_like(out)

    def bwd(lse=lse, dq=None, dk=None, dv=None):
        dq = torch.zeros_like(q) if dq is None else dq
        dk = torch.zeros_like(k) if dk is None else dk
        dv = torch.zeros_like(v) if dv is None else dv
        torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, 0.5, dq, dk, dv)

    with pytest.raises(RuntimeError, match=r"lse must have shape \[2, 2, 10\] \[B, H, N\], got shape \[2, 2, 11\]"):
        bwd(lse=torch.zeros(2, 2, 11, device=device))
    with pytest.raises(RuntimeError, match=r"lse must be Float for Float inputs .*got Double"):
        bwd(lse=lse.double())
    with pytest.raises(RuntimeError, match=r"dq must have shape \[2, 2, 10, 8\]"):
        bwd(dq=torch.zeros(2, 2, 10, 9, device=device))
    with pytest.raises(RuntimeError, match=r"dk must have the dtype of q \(Float\), got Half"):
        bwd(dk=torch.zeros_like(k, dtype=torch.half))
    with pytest.raises(RuntimeError, match=r"dv must have shape \[2, 2, 10, 16\]"):
        bwd(dv=torch.zeros(2, 2, 10, 8, device=device))
    with pytest.raises(RuntimeError, match=r"dv must have the dtype of q \(Float\), got Double"):
        bwd(dv=torch.zeros_like(v, dtype=torch.double))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [True, False], ids=["split_views", "separate"])
def test_double_backward_is_refused(device, split):
    """No second derivative: create_graph=True through psa_attention raises, naming it,
    instead of handing back gradients that silently carry no graph."""
    x = torch.randn(1, 2 * 32, 9, dtype=torch.float64, device=device, requires_grad=True)
    views = x.view(1, 2, 32, 9).split([8, 8, 16], dim=2)
    inputs = views if split else [t.detach().clone().requires_grad_() for t in views]
    out = psa_fa2_ext.psa_attention(*inputs)
    with pytest.raises(RuntimeError, match="psa_attention's backward is not differentiable"):
        torch.autograd.grad(out.square().sum(), inputs[0] if not split else x, create_graph=True)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_is_refused_token_major(device):
    q = torch.randn(1, 2, 9, 8, dtype=torch.float64, device=device, requires_grad=True)
    out = psa_fa2_ext.attention(q, q, q)
    with pytest.raises(RuntimeError, match="^attention's backward is not differentiable"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)
