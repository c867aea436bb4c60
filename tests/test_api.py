"""The Python surface: wrappers, autograd on qkv views, gradcheck, opcheck, torch.compile,
the seed's V-split accumulate contract, empty inputs."""
import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import psa_fa2_ext
from helpers import DEVICES, HAS_CUDA, assert_close_to_reference, make_qkv, requires_cuda
from psa_fa2_ext.reference import attention_eager, psa_attention_eager


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_psa_attention_on_ultralytics_views(device, dtype):
    """The block's own views go in uncopied; the result views as [B, C, h, w] for free and
    the qkv gradient matches the eager block's."""
    B, H, dk, dv, h, w = 2, 2, 32, 64, 7, 9
    N = h * w
    x = torch.randn(B, H * (2 * dk + dv), h, w, dtype=dtype, device=device, requires_grad=True)
    q, k, v = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    out = psa_fa2_ext.psa_attention(q, k, v)
    assert out.shape == (B, H, dv, N) and out.is_contiguous()
    out.view(B, H * dv, h, w)  # must not raise
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)

    x64 = x.detach().double().requires_grad_()
    q64, k64, v64 = x64.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    ref = psa_attention_eager(q64, k64, v64)
    (dx64,) = torch.autograd.grad(ref, x64, g.double())
    xe = x.detach().requires_grad_()
    qe, ke, ve = xe.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    eager = psa_attention_eager(qe, ke, ve)
    (dxe,) = torch.autograd.grad(eager, xe, g)
    assert_close_to_reference("out", out, ref, eager, dtype)
    assert_close_to_reference("dqkv", dx, dx64, dxe, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dk, dv, N", [(8, 16, 1), (1, 1, 13), (1, 1, 1)],
                         ids=["one_token", "head_dims_1", "all_1"])
def test_psa_attention_split_views_degenerate_sizes(device, dk, dv, N):
    """Split views whose layout is ambiguous (one token, or head dims of 1: token-major and
    channel-first are the same memory) still give a contiguous [B, H, dv, N] result and the
    eager block's values and qkv gradient."""
    B, H = 2, 3
    x = torch.randn(B, H * (2 * dk + dv), N, dtype=torch.float64, device=device,
                    requires_grad=True)
    out = psa_fa2_ext.psa_attention(*x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
    assert out.shape == (B, H, dv, N) and out.is_contiguous()
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().requires_grad_()
    ref = psa_attention_eager(*x64.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
    (dx64,) = torch.autograd.grad(ref, x64, g)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, dx64)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_token_major_and_strided(device):
    """attention() takes token-major tensors directly and makes other strides contiguous."""
    q, k, v = (torch.randn(2, 3, 33, d, dtype=torch.float64, device=device) for d in (16, 16, 24))
    torch.testing.assert_close(psa_fa2_ext.attention(q, k, v), attention_eager(q, k, v))
    qp = torch.randn(2, 3, 33, 32, dtype=torch.float64, device=device)[..., ::2]
    assert qp.stride(-1) != 1 and qp.stride(-2) != 1
    torch.testing.assert_close(psa_fa2_ext.attention(qp, k, v), attention_eager(qp, k, v))
    scale = 0.3
    torch.testing.assert_close(psa_fa2_ext.attention(q, k, v, scale),
                               attention_eager(q, k, v, scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
def test_gradcheck_float64(device, layout):
    qkv, *_ = make_qkv(1, 2, 9, 4, 6, torch.float64, device, layout, requires_grad=True)

    def f(qkv):
        if layout == "channel_first":
            q, k, v = qkv.view(1, 2, 14, 9).split([4, 4, 6], dim=2)
            return psa_fa2_ext.psa_attention(q, k, v, impl="reference" if device == "cuda" else "auto")
        q, k, v = qkv.split([4, 4, 6], dim=3)
        return psa_fa2_ext.attention(q, k, v, impl="reference" if device == "cuda" else "auto")

    assert torch.autograd.gradcheck(f, (qkv,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_fwd(device, layout, requires_grad):
    _, q, k, v = make_qkv(2, 2, 17, 8, 12, torch.float32, device, layout)
    q, k, v = (t.detach().requires_grad_(requires_grad) for t in (q, k, v))
    torch.library.opcheck(torch.ops.psa_fa2.fwd.default, (q, k, v, 0.35, "auto"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
@pytest.mark.parametrize("accumulate", [True, False])
def test_opcheck_bwd(device, layout, accumulate):
    _, q, k, v = make_qkv(2, 2, 17, 8, 12, torch.float32, device, layout)
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, 0.35)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
    torch.library.opcheck(torch.ops.psa_fa2.bwd.default,
                          (dout, q, k, v, out, lse, 0.35, dq, dk, dv, "auto", False, accumulate))


def test_torch_compile_with_the_area_as_an_argument():
    """area as an argument of the compiled function, compiled with dynamic=True: torch 2.11 /
    2.13 trace it as a symbolic int (as they do an int that changed between calls), which the
    traced path must take wherever it uses the area (it once formatted it into a message,
    which Dynamo refused)."""
    def step(x, area):
        q, k, v = x.view(2, 2, 128, 40).split([32, 32, 64], dim=2)
        return psa_fa2_ext.psa_attention(q, k, v, area=area).square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=True)
    for area in (4, 2, 8):
        x = torch.randn(2, 256, 5, 8, requires_grad=True)
        loss = compiled(x, area)
        (dx,) = torch.autograd.grad(loss, x)
        x2 = x.detach().requires_grad_()
        loss2 = step(x2, area)
        (dx2,) = torch.autograd.grad(loss2, x2)
        torch.testing.assert_close(loss, loss2)
        torch.testing.assert_close(dx, dx2)


def _leaves_and_operands(inputs):
    """The tensors a compiled step differentiates, and a function making q, k, v
    ([2, 2, D, 40]) from them: the split views of a contiguous or a channels_last conv
    output, or separate token-major tensors (each head's [N, D] contiguous)."""
    if inputs == "token_major":
        leaves = [torch.randn(2, 2, 40, d).requires_grad_() for d in (32, 32, 64)]
        return leaves, lambda q, k, v: (q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3))
    memory_format = torch.channels_last if inputs == "channels_last" else torch.contiguous_format
    x = torch.randn(2, 256, 5, 8).to(memory_format=memory_format).requires_grad_()
    return [x], lambda x: x.view(2, 2, 128, 40).split([32, 32, 64], dim=2)


@pytest.mark.parametrize("inputs", ["contiguous", "channels_last", "token_major"])
@pytest.mark.parametrize("area", [1, 4])
def test_torch_compile_fullgraph(area, inputs):
    """fake kernels + autograd registration let torch.compile trace forward and backward; with
    an area, on the area views psa_attention.cpp makes (runs as heads or in the batch, by the
    same rule), which read these inputs in place: the traced forward copies nothing before
    the fwd op."""
    leaves, operands = _leaves_and_operands(inputs)

    def step(*ts):
        return psa_fa2_ext.psa_attention(*operands(*ts), area=area).square().sum()

    graphs = AotEagerAndRecordGraphs()
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=graphs)
    loss = compiled(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    torch._dynamo.reset()
    (forward,) = graphs.fw_graphs
    before_fwd = forward.code.split("psa_fa2.fwd")[0]
    assert "clone" not in before_fwd and "copy" not in before_fwd, before_fwd
    leaves2 = [t.detach().requires_grad_() for t in leaves]
    loss2 = step(*leaves2)
    torch.testing.assert_close(loss, loss2)
    torch.testing.assert_close(grads, torch.autograd.grad(loss2, leaves2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
def test_v_split_accumulates_full_gradient(device, layout):
    """The seed's use: two bwd calls on V_lo / V_hi (and the matching halves of out and
    dout) into the same dq / dk give the full-V gradient; each call writes its own dv."""
    dtype = torch.float64
    _, q, k, v = make_qkv(2, 2, 37, 16, 32, dtype, device, layout)
    scale = 16 ** -0.5
    impl = "reference" if device == "cuda" else "auto"
    v_lo, v_hi = v[..., :16], v[..., 16:]
    out_lo, lse = torch.ops.psa_fa2.fwd(q, k, v_lo, scale, impl)
    out_hi, lse_hi = torch.ops.psa_fa2.fwd(q, k, v_hi, scale, impl)
    torch.testing.assert_close(lse, lse_hi)
    dout = torch.randn(2, 2, 37, 32, dtype=dtype, device=device)
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    dv_lo, dv_hi = torch.empty_like(v_lo), torch.empty_like(v_hi)
    for vv, o, g, dvv in ((v_lo, out_lo, dout[..., :16], dv_lo), (v_hi, out_hi, dout[..., 16:], dv_hi)):
        torch.ops.psa_fa2.bwd(g.contiguous() if layout == "token_major" else
                              g.transpose(2, 3).contiguous().transpose(2, 3),
                              q, k, vv, o, lse, scale, dq, dk, dvv, impl)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref = attention_eager(*leaves, scale)
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout)
    torch.testing.assert_close(dq, rq)
    torch.testing.assert_close(dk, rk)
    torch.testing.assert_close(torch.cat([dv_lo, dv_hi], dim=-1), rv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 2, 10), (2, 2, 0), (2, 0, 10)])
def test_empty_inputs_give_empty_results(device, shape):
    B, H, N = shape
    q = torch.randn(B, H, 8, N, device=device, requires_grad=True)
    k = torch.randn(B, H, 8, N, device=device, requires_grad=True)
    v = torch.randn(B, H, 16, N, device=device, requires_grad=True)
    out = psa_fa2_ext.psa_attention(q, k, v)
    assert out.shape == (B, H, 16, N)
    out.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_propagate_like_eager(device):
    q, k, v = (torch.randn(1, 1, 6, 8, dtype=torch.float64, device=device) for _ in range(3))
    q[0, 0, 1, 2] = float("nan")
    k[0, 0, 3, 0] = float("inf")
    out = psa_fa2_ext.attention(q, k, v)
    ref = attention_eager(q, k, v)
    assert torch.equal(out.isnan(), ref.isnan())
    finite = ~ref.isnan()
    torch.testing.assert_close(out[finite], ref[finite])


@requires_cuda
def test_autocast_runs_in_lower_precision():
    q, k, v = (torch.randn(2, 2, 32, 49, device="cuda") for _ in range(3))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = psa_fa2_ext.psa_attention(q, k, v)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("api", ["psa_attention", "attention"])
def test_autocast_cpu(api):
    q, k, v = (torch.randn(2, 2, 16, 49, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = getattr(psa_fa2_ext, api)(q, k, v)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32


def test_build_info():
    info = psa_fa2_ext.build_info()
    assert info["version"] == psa_fa2_ext.__version__
    assert isinstance(info["cuda"], bool)
    if HAS_CUDA:
        assert info["cuda_archs"]


@pytest.mark.parametrize("device", DEVICES)
def test_split_views_get_one_gradient_buffer(device):
    """On the block's split views the backward writes the qkv gradient in one buffer (no
    per-view gradients for autograd to cat); separate tensors take the general path; both
    give the same numbers."""
    B, H, dk, dv, N = 2, 2, 16, 32, 45
    x = torch.randn(B, H * (2 * dk + dv), N, dtype=torch.float64, device=device, requires_grad=True)
    q, k, v = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    out = psa_fa2_ext.psa_attention(q, k, v)
    assert "SplitQKV" in out.grad_fn.name()
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)

    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out2 = psa_fa2_ext.psa_attention(qs, ks, vs)
    assert "SeparateQKV" in out2.grad_fn.name()
    grads = torch.autograd.grad(out2, (qs, ks, vs), g)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)
    torch.testing.assert_close(dx, torch.cat(grads, dim=2).view_as(dx))


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_qkv(device):
    """A channels_last conv output gives token-major views: read in place, and the result
    is still [B, H, dv, N] contiguous, with the eager block's values and gradients."""
    B, H, dk, dv, h, w = 2, 2, 16, 32, 5, 7
    x = torch.randn(B, H * (2 * dk + dv), h, w, dtype=torch.float64, device=device)
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    q, k, v = x.view(B, H, 2 * dk + dv, h * w).split([dk, dk, dv], dim=2)
    assert q.transpose(2, 3).stride(-1) == 1
    out = psa_fa2_ext.psa_attention(q, k, v)
    assert out.is_contiguous() and out.shape == (B, H, dv, h * w)
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().requires_grad_()
    ref = psa_attention_eager(*x64.view(B, H, 2 * dk + dv, h * w).split([dk, dk, dv], dim=2))
    (dx64,) = torch.autograd.grad(ref, x64, g)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, dx64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [True, False], ids=["split_views", "separate"])
def test_psa_attention_output_used_like_any_op_output(device, split):
    """The result takes further ops and back-propagates like an eager result; modifying it
    in place before the backward (which reads it) is an error, as for SDPA, not a silently
    wrong gradient."""
    B, H, dk, dv, N = 2, 2, 8, 16, 21
    x = torch.randn(B, H * (2 * dk + dv), N, dtype=torch.float64, device=device, requires_grad=True)
    views = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    inputs = views if split else [t.detach().clone().requires_grad_() for t in views]
    out = psa_fa2_ext.psa_attention(*inputs)
    (out.view(B, H * dv, N) * 3.0).sum().backward()
    x64 = x.detach().requires_grad_()
    ref = psa_attention_eager(*x64.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)) * 3.0
    ref.sum().backward()
    got = x.grad if split else torch.cat([t.grad for t in inputs], dim=2).view_as(x)
    torch.testing.assert_close(got, x64.grad)

    out = psa_fa2_ext.psa_attention(*inputs)
    out.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_psa_attention_gradient_of_some_inputs(device):
    """Only v requires grad: q and k get none, v's gradient is the eager one."""
    q, k = (torch.randn(1, 2, 8, 19, dtype=torch.float64, device=device) for _ in range(2))
    v = torch.randn(1, 2, 12, 19, dtype=torch.float64, device=device, requires_grad=True)
    g = torch.randn(1, 2, 12, 19, dtype=torch.float64, device=device)
    (dv,) = torch.autograd.grad(psa_fa2_ext.psa_attention(q, k, v), v, g)
    v64 = v.detach().requires_grad_()
    (dv64,) = torch.autograd.grad(psa_attention_eager(q, k, v64), v64, g)
    torch.testing.assert_close(dv, dv64)


@pytest.mark.parametrize("device", DEVICES)
def test_psa_attention_in_inference_mode(device):
    q, k, v = (torch.randn(2, 2, d, 30, device=device) for d in (16, 16, 32))
    with torch.inference_mode():
        out = psa_fa2_ext.psa_attention(q, k, v)
    assert out.is_contiguous() and not out.requires_grad
    torch.testing.assert_close(out, psa_attention_eager(q, k, v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layouts", [("tm", "tm", "tm"), ("cf", "cf", "cf"), ("tm", "cf", "tm")])
def test_attention_op_keeps_layout_and_differentiates(device, layouts):
    """torch.ops.psa_fa2.attention (what attention() calls): the result in the operands'
    layout (token-major when they share none), values and gradients of float64 eager."""
    def operand(d, layout):
        t = torch.randn(2, 3, 21, d, dtype=torch.float64, device=device)
        t = t if layout == "tm" else t.transpose(2, 3).contiguous().transpose(2, 3)
        return t.requires_grad_()
    q, k, v = (operand(d, layout) for d, layout in zip((8, 8, 12), layouts))
    g = torch.randn(2, 3, 21, 12, dtype=torch.float64, device=device)
    impl = "reference" if device == "cuda" else "auto"
    out = torch.ops.psa_fa2.attention(q, k, v, 0.4, impl)
    if layouts == ("cf", "cf", "cf"):
        assert out.stride(2) == 1
    else:
        assert out.is_contiguous()
    grads = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().requires_grad_() for t in (q, k, v))
    ref = attention_eager(q64, k64, v64, 0.4)
    refs = torch.autograd.grad(ref, (q64, k64, v64), g)
    torch.testing.assert_close(out, ref)
    for name, got, want in zip("qkv", grads, refs):
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_attention_in_inference_mode(device):
    q, k, v = (torch.randn(2, 2, 30, d, device=device) for d in (16, 16, 32))
    with torch.inference_mode():
        out = psa_fa2_ext.attention(q, k, v)
    assert not out.requires_grad
    torch.testing.assert_close(out, attention_eager(q, k, v), rtol=1e-4, atol=1e-5)


@requires_cuda
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "deterministic"])
def test_psa_attention_training_step_in_a_cuda_graph(deterministic):
    """A whole training step (split views, psa_attention, backward into the qkv leaf) captured
    in a CUDA graph, as torch.compile's "reduce-overhead" mode and whole-network capture do:
    replayed on new inputs it gives what the eager step gives on them. The forward has no
    atomics, so its result must match to the bit; the backward's dQ atomics may round in
    another order unless deterministic."""
    B, H, dk, dv, h, w = 2, 2, 32, 64, 9, 11
    N = h * w
    torch.manual_seed(0)
    x = torch.randn(B, H * (2 * dk + dv), h, w, dtype=torch.bfloat16, device="cuda",
                    requires_grad=True)
    g = torch.randn(B, H, dv, N, dtype=torch.bfloat16, device="cuda")

    def step():
        out = psa_fa2_ext.psa_attention(*x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2))
        out.backward(g)
        # Detached, as a training loop keeps no graph past its step: the captured step's graph
        # kept alive would hand the eager steps its AccumulateGrad node, recorded on the
        # capture's stream (autograd warns about that mismatch).
        return out.detach()

    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up off the capture, as the CUDA graph docs do
            for _ in range(3):
                x.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        x.grad = None
        with torch.cuda.graph(graph):
            out_static = step()
        grad_static = x.grad

        for _ in range(2):
            with torch.no_grad():
                x.copy_(torch.randn_like(x))
                g.copy_(torch.randn_like(g))
                out_static.fill_(float("nan"))
                grad_static.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            out_graph, grad_graph = out_static.clone(), grad_static.clone()
            x.grad = None
            out_eager = step()
            torch.testing.assert_close(out_graph, out_eager, rtol=0, atol=0)
            if deterministic:
                torch.testing.assert_close(grad_graph, x.grad, rtol=0, atol=0)
            else:
                torch.testing.assert_close(grad_graph, x.grad)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [32, 48], ids=["rtdetr_l", "rtdetr_x"])
def test_attention_on_head_views_of_a_projection(device, dtype, D):
    """AIFI's / nn.MultiheadAttention's operands: [B, N, H, D] head views of one projection,
    at RT-DETR-l's head dim 32 and RT-DETR-x's 48 (which no fast CUDA kernel has: the
    reference kernel there). The result comes in the same order (its reshape to [B, N, C] is
    a view), and values and gradients are float64 eager's to the dtype's tolerance."""
    B, N, H = 2, 401, 8
    x = torch.randn(B, N, 3 * H * D, dtype=dtype, device=device, requires_grad=True)
    q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x.split(H * D, dim=-1))
    out = psa_fa2_ext.attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous()
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, g)

    def eager(precision):
        x_ = x.detach().to(precision).requires_grad_()
        qe, ke, ve = (t.view(B, N, H, D).transpose(1, 2) for t in x_.split(H * D, dim=-1))
        o = attention_eager(qe, ke, ve)
        return o, torch.autograd.grad(o, x_, g.to(precision))[0]

    (ref, dref), (same, dsame) = eager(torch.float64), eager(dtype)
    assert_close_to_reference("out", out, ref, same, dtype)
    assert_close_to_reference("dx", dx, dref, dsame, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_head_view_gradients_need_no_copy(device, compiled):
    """AIFI's three projections [B, N, C], each viewed as heads [B, H, N, D]: the backward
    hands each view a gradient with the view's own strides, so autograd's way back to the
    projection (transpose, view) is free instead of one copy per projection."""
    B, N, H, D = 2, 40, 4, 32
    xs = [torch.randn(B, N, H * D, device=device, requires_grad=True) for _ in range(3)]
    q, k, v = (x.view(B, N, H, D).transpose(1, 2) for x in xs)
    seen = []
    for t in (q, k, v):
        t.register_hook(seen.append)

    def run(q, k, v):
        return psa_fa2_ext.attention(q, k, v)
    out = (torch.compile(run, fullgraph=True, backend="aot_eager") if compiled else run)(q, k, v)
    out.sum().backward()
    assert [g.stride() for g in seen] == [q.stride()] * 3
    assert all(x.grad.is_contiguous() for x in xs)
