"""The attention's autograd is registered twice; both registrations must give the same outputs
and the same gradients.

- C++ (psa_attention.cpp, under csrc/): the Autograd-key kernels of
  torch.ops.psa_fa2.psa_attention and torch.ops.psa_fa2.attention. Their nodes are SeparateQKV
  (any q, k, v) and SplitQKV (q, k, v exactly the split views of one [B, H * (2dk + dv), ...]
  tensor, contiguous or channels_last: it writes that tensor's gradient in one buffer). Reached by
  calling psa_fa2_ext.psa_attention or psa_fa2_ext.attention eagerly: outside torch.compile
  the wrappers call those ops. The tests check the output's grad_fn names the node they mean.
- Python (psa_fa2_ext/ops.py): torch.library.register_autograd("psa_fa2::fwd", ...), the fwd
  op's own autograd. Reached
    (a) under torch.compile: the same wrappers then call torch.ops.psa_fa2.fwd, and
        AOTAutograd traces the backward from this registration. backend="aot_eager" runs the
        traced graphs eagerly on the same kernels. The tests check the recorded forward graph
        calls psa_fa2.fwd (neither psa_fa2.psa_attention nor psa_fa2.attention) and the
        backward graph calls psa_fa2.bwd;
    (b) eagerly, by calling torch.ops.psa_fa2.fwd (psa_fa2_ext.fwd) on tensors that require
        grad. The tests check its grad_fn is the node that torch.library generates for fwd.

Both formulas run the same fwd and bwd kernels on the same operands (bwd with
accumulate=False into fresh buffers) and agree to the last bit on the CPU; the tolerances
(relative to the largest element: 1e-12 in float64, 1e-6 in float32) leave room for no more
than a different summation order.
"""
import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import psa_fa2_ext
from helpers import rel_err

pytestmark = pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd")

B, H, DK, DV, HW = 2, 2, 16, 32, (9, 15)
C, N = 2 * DK + DV, HW[0] * HW[1]  # N = 135: more than one 128-query tile of the CPU kernels
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}
APIS = ["psa_attention", "attention"]
LAYOUTS = ["channel_first", "token_major"]
DTYPES = [torch.float64, torch.float32]
SCALES = [None, 0.3]


def make_leaves(api, inputs, layout, dtype):
    """The tensors that require grad: one qkv tensor ("split_views") or q, k, v themselves
    ("separate"), laid out so that the operators see `layout`. psa_attention takes [B, H, D, N]
    operands (channel-first in memory: the block's conv output; token-major: a channels_last
    one), attention [B, H, N, D] ones."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    if inputs == "split_views":
        if api == "psa_attention":
            x = randn(B, H * C, N) if layout == "channel_first" else (
                randn(B, H * C, *HW).to(memory_format=torch.channels_last))
        else:
            x = randn(B, H, N, C) if layout == "token_major" else randn(B, H * C, N)
        return [x.requires_grad_()]

    # Each operand in its own tensor, [B, H, N, D] for the operators in `layout`.
    def operand(d):
        t = randn(B, H, N, d) if layout == "token_major" else randn(B, H, d, N).transpose(2, 3)
        return (t.transpose(2, 3) if api == "psa_attention" else t).requires_grad_()
    return [operand(d) for d in (DK, DK, DV)]


def operands(api, inputs, layout, leaves):
    """q, k, v as `api` takes them, made from the leaves."""
    if inputs == "separate":
        return leaves
    (x,) = leaves
    if api == "psa_attention":
        return x.view(B, H, C, N).split([DK, DK, DV], dim=2)
    if layout == "token_major":
        return x.split([DK, DK, DV], dim=3)
    return [t.transpose(2, 3) for t in x.view(B, H, C, N).split([DK, DK, DV], dim=2)]


def assert_operator_layout(api, layout, q, k, v):
    """q, k, v reach the operators ([B, H, N, D]) in `layout`."""
    for t in (q, k, v):
        t = t.transpose(2, 3) if api == "psa_attention" else t
        assert t.stride(3 if layout == "token_major" else 2) == 1, (layout, t.stride())


def fresh(leaves):
    """Copies of the leaves, values and strides kept, that require grad."""
    return [t.detach().clone().requires_grad_() for t in leaves]


def run_cpp(api, inputs, layout, leaves, scale, g):
    leaves = fresh(leaves)
    out = getattr(psa_fa2_ext, api)(*operands(api, inputs, layout, leaves), scale)
    return out, torch.autograd.grad(out, leaves, g), out.grad_fn.name()


def run_compiled(api, inputs, layout, leaves, scale, g):
    leaves = fresh(leaves)
    graphs = AotEagerAndRecordGraphs()
    torch._dynamo.reset()
    f = torch.compile(lambda *ls: getattr(psa_fa2_ext, api)(*operands(api, inputs, layout, ls),
                                                            scale),
                      backend=graphs, fullgraph=True)
    out = f(*leaves)
    grads = torch.autograd.grad(out, leaves, g)
    torch._dynamo.reset()
    return out, grads, graphs


def run_python_eager(api, inputs, layout, leaves, scale, g):
    """torch.ops.psa_fa2.fwd called directly: the Python registration without torch.compile.
    The scale the wrappers use when none is given is dk ** -0.5."""
    leaves = fresh(leaves)
    q, k, v = operands(api, inputs, layout, leaves)
    if api == "psa_attention":
        q, k, v = (t.transpose(2, 3) for t in (q, k, v))
    out = torch.ops.psa_fa2.fwd(q, k, v, DK ** -0.5 if scale is None else scale)[0]
    node = out.grad_fn.name()
    if api == "psa_attention":
        out = out.transpose(2, 3)
    return out, torch.autograd.grad(out, leaves, g), node


def assert_agree(name, ours, theirs, dtype):
    assert ours.shape == theirs.shape, f"{name}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}"
    err, tol = rel_err(ours, theirs), TOLERANCE[dtype]
    assert err <= tol, f"{name}: relative difference {err:.3e} > {tol:.0e}"


def assert_same_results(path, result, reference, leaf_names, dtype):
    (out, grads), (ref_out, ref_grads) = result, reference
    assert_agree(f"{path}: out", out, ref_out, dtype)
    for name, grad, ref in zip(leaf_names, grads, ref_grads, strict=True):
        assert_agree(f"{path}: d{name}", grad, ref, dtype)


@pytest.mark.parametrize("scale", SCALES, ids=["default_scale", "scale_0.3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("inputs", ["split_views", "separate"])
@pytest.mark.parametrize("api", APIS)
def test_cpp_and_python_autograd_agree(api, inputs, layout, dtype, scale):
    """The C++ node and the Python registration, both ways it is reached, on the same
    inputs: the same output (and, compiled, the same output strides) and the same gradient of
    every leaf."""
    leaves = make_leaves(api, inputs, layout, dtype)
    assert_operator_layout(api, layout, *operands(api, inputs, layout, leaves))
    leaf_names = ["qkv"] if inputs == "split_views" else ["q", "k", "v"]
    shape = (B, H, DV, N) if api == "psa_attention" else (B, H, N, DV)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=dtype)

    out, grads, node = run_cpp(api, inputs, layout, leaves, scale, g)
    # The block's split views (of a contiguous conv output, or of a channels_last one) take the
    # node that writes one qkv gradient.
    one_buffer = api == "psa_attention" and inputs == "split_views"
    assert ("SplitQKV" if one_buffer else "SeparateQKV") in node, node
    cpp = (out, grads)

    c_out, c_grads, graphs = run_compiled(api, inputs, layout, leaves, scale, g)
    fw = "\n".join(gm.code for gm in graphs.fw_graphs)
    bw = "\n".join(gm.code for gm in graphs.bw_graphs)
    assert "psa_fa2.fwd" in fw and "psa_fa2.bwd" in bw, "compiled: not the fwd op's autograd"
    assert "psa_fa2.psa_attention" not in fw and "psa_fa2.attention" not in fw, (
        "compiled: the C++ autograd ops were traced, not the fwd op's autograd")
    assert c_out.stride() == out.stride(), f"compiled: strides {c_out.stride()} vs {out.stride()}"
    assert_same_results("compiled", (c_out, c_grads), cpp, leaf_names, dtype)

    p_out, p_grads, p_node = run_python_eager(api, inputs, layout, leaves, scale, g)
    assert "psa_fa2_fwd" in p_node, p_node
    assert_same_results("fwd op, eager", (p_out, p_grads), cpp, leaf_names, dtype)


@pytest.mark.parametrize("api", APIS)
def test_gradient_of_some_inputs_agrees(api):
    """Only v requires grad: the C++ node and the compiled Python registration give the same
    output and dv."""
    q, k, v = (t.detach() for t in make_leaves(api, "separate", "channel_first", torch.float64))
    shape = (B, H, DV, N) if api == "psa_attention" else (B, H, N, DV)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fn = getattr(psa_fa2_ext, api)
    results = []
    for wrap in (lambda f: f, lambda f: torch.compile(f, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        (vv,) = fresh([v])
        out = wrap(lambda q, k, v: fn(q, k, v))(q, k, vv)
        results.append((out, torch.autograd.grad(out, vv, g)))
    torch._dynamo.reset()
    assert "SeparateQKV" in results[0][0].grad_fn.name()
    assert "CompiledFunction" in results[1][0].grad_fn.name()
    assert_same_results("compiled", results[1], results[0], ["v"], torch.float64)


@pytest.mark.parametrize("path", ["psa_attention_split_views", "psa_attention_separate",
                                  "attention", "fwd_op"])
def test_eager_double_backward_refused_on_every_path(path):
    """create_graph=True through either eager registration is an error, not gradients that
    come back as constants. (Under torch.compile the Python registration leaves double
    backward to AOTAutograd, which refuses it itself.)"""
    x = torch.randn(B, H * C, N, dtype=torch.float64, requires_grad=True)
    q, k, v = x.view(B, H, C, N).split([DK, DK, DV], dim=2)
    leaves = [x]
    if path == "psa_attention_split_views":
        out = psa_fa2_ext.psa_attention(q, k, v)
        assert "SplitQKV" in out.grad_fn.name()
    elif path == "psa_attention_separate":
        leaves = fresh([q, k, v])
        out = psa_fa2_ext.psa_attention(*leaves)
        assert "SeparateQKV" in out.grad_fn.name()
    elif path == "attention":
        out = psa_fa2_ext.attention(*(t.transpose(2, 3) for t in (q, k, v)))
        assert "SeparateQKV" in out.grad_fn.name()
    else:
        out = torch.ops.psa_fa2.fwd(*(t.transpose(2, 3) for t in (q, k, v)), 0.3)[0]
        assert "psa_fa2_fwd" in out.grad_fn.name()
    with pytest.raises(RuntimeError, match="backward is not differentiable: create_graph=True"):
        torch.autograd.grad(out.sum(), leaves, create_graph=True)
