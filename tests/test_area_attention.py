"""psa_attention(..., area=A): attention within A equal runs of N, YOLO12's area attention,
on the split views of the un-reshaped qkv tensor, read in place. Every result is checked
against float64 eager math run on each run of tokens separately, on fresh random inputs."""
import pytest
import torch

import psa_fa2_ext
from helpers import DEVICES, assert_close_to_reference, poison_cuda_allocator, requires_cuda
from psa_fa2_ext.reference import psa_attention_eager


def area_eager(q, k, v, scale, area):
    """Ultralytics' math on each of `area` runs of N ([B, H, D, N] operands)."""
    runs = zip(*(t.chunk(area, dim=3) for t in (q, k, v)))
    return torch.cat([psa_attention_eager(a, b, c, scale) for a, b, c in runs], dim=3)


def block_views(B, H, dk, dv, N, dtype, device, requires_grad=False, channels_last=False):
    """The conv output [B, H*(2dk+dv), N] and its q, k, v split views [B, H, D, N]; with
    channels_last, a [B, H*(2dk+dv), h, w] conv output in that memory format (h w = N), as
    Ultralytics' trainer makes on CUDA and its predictor on x86 CPUs, whose views are
    token-major with the heads inside the tokens."""
    if channels_last:
        w = max(d for d in range(1, int(N ** 0.5) + 1) if N % d == 0)
        x = torch.randn(B, H * (2 * dk + dv), N // w, w, dtype=dtype, device=device)
        x = x.to(memory_format=torch.channels_last)
    else:
        x = torch.randn(B, H * (2 * dk + dv), N, dtype=dtype, device=device)
    x.requires_grad_(requires_grad)
    return (x, *x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))


def check_area_attention(device, dtype, B, H, dk, dv, N, area, impl="auto", channels_last=False):
    x, q, k, v = block_views(B, H, dk, dv, N, dtype, device, requires_grad=True,
                             channels_last=channels_last)
    scale = dk ** -0.5
    if device == "cuda":
        poison_cuda_allocator(8 * B * H * N * (2 * dk + dv) * 8, device)
    out = psa_fa2_ext.psa_attention(q, k, v, scale, impl=impl, area=area)
    assert out.shape == (B, H, dv, N) and out.is_contiguous()
    assert "SplitQKV" in out.grad_fn.name()  # the one-buffer node, on the views in place
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)

    def eager_grads(precision):
        x_ = x.detach().to(precision).requires_grad_()
        q_, k_, v_ = x_.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
        o = area_eager(q_, k_, v_, scale, area)
        return o, torch.autograd.grad(o, x_, g.to(precision))[0]

    ref, dref = eager_grads(torch.float64)
    same, dsame = eager_grads(dtype)
    assert_close_to_reference("out", out, ref, same, dtype)
    assert_close_to_reference("dqkv", dx, dref, dsame, dtype)
    # The one gradient buffer is in the conv output's memory format.
    assert dx.stride() == x.stride()


SHAPES = [  # B, H, dk, dv, N, area
    (2, 2, 32, 32, 64, 4),    # YOLO12 AAttn's head dim
    (2, 3, 32, 32, 28, 4),    # runs of 7: odd, below one tile
    (1, 2, 32, 64, 400, 4),   # PSA's head dims, runs of 100
    (2, 1, 16, 8, 30, 2),
    (1, 2, 32, 32, 36, 1),    # area 1 is psa_attention as before
]
shapes = pytest.mark.parametrize("B, H, dk, dv, N, area", SHAPES,
                                 ids=["x".join(map(str, s)) for s in SHAPES])


# The conv output contiguous, or channels_last (Ultralytics on CUDA): then the areas' runs
# merge with the batch instead of the heads, still read in place.
memory_formats = pytest.mark.parametrize("channels_last", [False, True],
                                         ids=["contiguous", "channels_last"])


@shapes
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@memory_formats
def test_area_attention_cpu(B, H, dk, dv, N, area, dtype, channels_last):
    check_area_attention("cpu", dtype, B, H, dk, dv, N, area, channels_last=channels_last)


@requires_cuda
@shapes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("impl", ["auto", "reference"])
@memory_formats
def test_area_attention_cuda(B, H, dk, dv, N, area, dtype, impl, channels_last):
    check_area_attention("cuda", dtype, B, H, dk, dv, N, area, impl, channels_last)


@pytest.mark.parametrize("device", DEVICES)
def test_area_attention_on_separate_tensors(device):
    """Inputs that are not the split views of one tensor: each gets its own gradient, equal to
    the split views' (one copy of the inputs makes them such views)."""
    B, H, dk, dv, N, area = 2, 2, 16, 24, 40, 4
    x, q, k, v = block_views(B, H, dk, dv, N, torch.float64, device, requires_grad=True)
    out = psa_fa2_ext.psa_attention(q, k, v, area=area)
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out2 = psa_fa2_ext.psa_attention(qs, ks, vs, area=area)
    grads = torch.autograd.grad(out2, (qs, ks, vs), g)
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(grads, dim=2).view_as(dx), dx, rtol=0, atol=0)
    # Only k needs a gradient.
    kk = k.detach().clone().requires_grad_()
    (dk_only,) = torch.autograd.grad(psa_fa2_ext.psa_attention(q.detach(), kk, v.detach(),
                                                               area=area), kk, g)
    torch.testing.assert_close(dk_only, grads[1])


@pytest.mark.parametrize("device", DEVICES)
def test_area_attention_token_major_and_inference(device):
    """Token-major operands (a channels_last conv output's views) and no-grad / inference
    calls give the same numbers as the split views with gradients."""
    B, H, dk, dv, N, area = 2, 2, 16, 16, 48, 4
    x, q, k, v = block_views(B, H, dk, dv, N, torch.float64, device)
    ref = area_eager(q, k, v, dk ** -0.5, area)
    token_major = [t.transpose(2, 3).contiguous().transpose(2, 3) for t in (q, k, v)]
    assert token_major[0].stride(2) == 1
    with torch.no_grad():
        torch.testing.assert_close(psa_fa2_ext.psa_attention(*token_major, area=area), ref)
    with torch.inference_mode():
        out = psa_fa2_ext.psa_attention(q, k, v, area=area)
    assert out.is_contiguous()
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_area_attention_reads_views_and_writes_block_output(device):
    """The forward's output is the block's [B, H, dv, N] memory: the result is a view of the
    operator's output, with no copy after (the op's out, seen through area views, strides
    less over heads than over the head dim)."""
    B, H, dk, dv, N, area = 1, 2, 32, 32, 64, 4
    _, q, k, v = block_views(B, H, dk, dv, N, torch.float32, device)
    run = N // area
    qa, ka, va = (t.flatten(0, 1).unflatten(2, (area, run)).transpose(1, 2).transpose(2, 3)
                  for t in (q, k, v))
    assert qa.data_ptr() == q.data_ptr() and qa.stride() == (q.stride(1), run, 1, N)
    out, _ = torch.ops.psa_fa2.fwd(qa, ka, va, dk ** -0.5)
    assert out.stride() == (dv * N, run, 1, N)


@pytest.mark.parametrize("device", DEVICES)
def test_area_attention_errors(device):
    _, q, k, v = block_views(1, 2, 8, 8, 9, torch.float32, device)
    with pytest.raises(RuntimeError, match=r"area = 4 must divide the sequence length N = 9"):
        psa_fa2_ext.psa_attention(q, k, v, area=4)
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"area = 2 must divide"):
        psa_fa2_ext.psa_attention(q, k, v, area=2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"area must be an int >= 1, got"):
            psa_fa2_ext.psa_attention(q, k, v, area=bad)
    with pytest.raises(RuntimeError, match=r"area must be >= 1, got 0"):
        torch.ops.psa_fa2.psa_attention(q, k, v, 0.5, "auto", 0)
    with pytest.raises(RuntimeError, match=r"must share B, H and N"):
        psa_fa2_ext.psa_attention(q, k[:, :, :, :8], v, area=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 2, 8), (2, 2, 0), (2, 0, 8)])
def test_area_attention_empty(device, shape):
    B, H, N = shape
    q, k = (torch.randn(B, H, 8, N, device=device, requires_grad=True) for _ in range(2))
    v = torch.randn(B, H, 16, N, device=device, requires_grad=True)
    out = psa_fa2_ext.psa_attention(q, k, v, area=4)
    assert out.shape == (B, H, 16, N)
    out.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


def test_area_attention_autocast_cpu():
    x, q, k, v = block_views(2, 2, 16, 16, 32, torch.float32, "cpu", requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = psa_fa2_ext.psa_attention(q, k, v, area=4)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32


def test_area_attention_opcheck():
    _, q, k, v = block_views(2, 2, 8, 8, 24, torch.float64, "cpu")
    torch.library.opcheck(torch.ops.psa_fa2.psa_attention.default, (q, k, v, 0.3, "auto", 3))
