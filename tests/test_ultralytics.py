"""The drop-in layer and the model patch against Ultralytics' own ``Attention`` as the oracle.

CPU, float64 where numbers are compared, so any difference above round-off is a bug in
our math or wiring rather than precision. CI installs ultralytics
(requirements-ultralytics.txt); the importorskip only guards local runs without it.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

pytest.importorskip("ultralytics")

from ultralytics.nn.modules.block import C2PSA, Attention
from ultralytics.nn.tasks import DetectionModel

import psa_fa2_ext.nn as psa_nn
from psa_fa2_ext.nn import PSAAttention
from psa_fa2_ext.patch import is_patched, patch_ultralytics, patched, unpatch_ultralytics

RTOL64 = 1e-9

# (dim, num_heads, attn_ratio): the shipped head shape (kd 32, hd 64) at one and two
# heads, and ratios that give dk == dv and a non-power-of-two key dim.
CONFIGS = [(64, 1, 0.5), (128, 2, 0.5), (96, 2, 1.0), (96, 1, 0.25)]


def _flat(out) -> list[torch.Tensor]:
    """Every tensor in a model output (tensors, tuples/lists, dicts), in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flat(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def _assert_close(actual, expected, rtol=RTOL64, what="output", atol=0.0):
    """Max abs error <= rtol * max |expected| (+ atol), tensor by tensor."""
    a, e = _flat(actual), _flat(expected)
    assert len(a) == len(e) and a, f"{what}: {len(a)} tensors vs {len(e)}"
    for i, (x, y) in enumerate(zip(a, e)):
        assert x.shape == y.shape, f"{what}[{i}]: shape {tuple(x.shape)} vs {tuple(y.shape)}"
        err = (x.double() - y.double()).abs().max().item()
        ref = y.double().abs().max().item()
        assert err <= rtol * ref + atol, f"{what}[{i}]: max abs err {err:.3e}, max |ref| {ref:.3e}, atol {atol:.1e}"


def _assert_grads_close(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Every parameter gradient within RTOL64 of the oracle's.

    Some gradients are analytically zero and hold only round-off (a conv/BN bias whose
    per-channel shift a later train-mode BN removes), so each tensor also gets an
    absolute floor of 1e-12 x the largest gradient in the module: 10^4 ulps in float64,
    far below any real error.
    """
    pt, po = dict(theirs.named_parameters()), dict(ours.named_parameters())
    assert list(pt) == list(po)
    grads = [p.grad.abs().max().item() for p in pt.values() if p.grad is not None]
    assert grads, "no gradients"
    atol = 1e-12 * max(grads)
    for name, p in pt.items():
        if p.grad is None:
            assert po[name].grad is None, name
            continue
        assert po[name].grad is not None, name
        _assert_close(po[name].grad, p.grad, what=f"grad {name}", atol=atol)


def _randomize_bn(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BN affine params and running stats, so eval mode exercises them too."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


def _pair(dim, heads, ratio, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    theirs = Attention(dim, num_heads=heads, attn_ratio=ratio)
    _randomize_bn(theirs, gen)
    ours = PSAAttention(dim, num_heads=heads, attn_ratio=ratio)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs.double(), ours.double()


# --- the layer -------------------------------------------------------------------------


@pytest.mark.parametrize("dim,heads,ratio", CONFIGS)
def test_same_attributes_and_state_dict_keys(dim, heads, ratio):
    theirs, ours = Attention(dim, heads, ratio), PSAAttention(dim, heads, ratio)
    for name in ("num_heads", "head_dim", "key_dim", "scale"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.format is None and type(ours).format is None
    sd_t, sd_o = theirs.state_dict(), ours.state_dict()
    assert list(sd_t) == list(sd_o)
    for k in sd_t:
        assert sd_t[k].shape == sd_o[k].shape and sd_t[k].dtype == sd_o[k].dtype, k
    assert [n for n, _ in theirs.named_modules()] == [n for n, _ in ours.named_modules()]
    for name in ("qkv", "proj", "pe"):  # conv hyper-parameters and activation match
        ct, co = getattr(theirs, name), getattr(ours, name)
        for attr in ("kernel_size", "stride", "padding", "dilation", "groups"):
            assert getattr(ct.conv, attr) == getattr(co.conv, attr), (name, attr)
        assert ct.conv.bias is None and co.conv.bias is None
        assert (ct.bn.eps, ct.bn.momentum) == (co.bn.eps, co.bn.momentum)
        assert type(ct.act) is type(co.act) is torch.nn.Identity


def test_state_dict_loads_both_ways_strict():
    gen = torch.Generator().manual_seed(1)
    theirs, ours = Attention(128, 2), PSAAttention(128, 2)
    _randomize_bn(theirs, gen)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    back = Attention(128, 2)
    back.load_state_dict(ours.state_dict(), strict=True)
    for k, v in theirs.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dim,heads,ratio", CONFIGS)
def test_matches_ultralytics_float64(dim, heads, ratio, train):
    theirs, ours = _pair(dim, heads, ratio)
    theirs.train(train), ours.train(train)
    # Odd spatial sizes: N = 35, and a batch of 2 so BN's batch stats are not degenerate.
    x = torch.randn(2, dim, 5, 7, dtype=torch.float64)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yt, yo = theirs(xt), ours(xo)
    _assert_close(yo, yt)
    g = torch.randn_like(yt)
    yt.backward(g), yo.backward(g)
    _assert_close(xo.grad, xt.grad, what="input grad")
    assert all(p.grad is not None for p in theirs.parameters())
    _assert_grads_close(ours, theirs)
    if train:  # BN running stats moved the same way
        _assert_close(list(ours.state_dict().values()), list(theirs.state_dict().values()), what="buffers")


@pytest.mark.parametrize("which", ["layer", "patched"])
def test_channels_last(which):
    """Ultralytics trains with channels_last on CUDA: q, k, v then arrive token-major."""
    theirs, ours = _pair(128, 2, 0.5)
    if which == "patched":
        ours = copy.deepcopy(theirs)
        patch_ultralytics(ours)
    x = torch.randn(2, 128, 5, 7, dtype=torch.float64)
    ref = theirs.eval()(x)
    ours = ours.eval().to(memory_format=torch.channels_last)
    xl = x.to(memory_format=torch.channels_last).requires_grad_()
    _assert_close(ours(xl), ref)
    ours(xl).sum().backward()
    xr = x.clone().requires_grad_()
    theirs(xr).sum().backward()
    _assert_close(xl.grad, xr.grad, what="input grad")


def test_fused_state_matches_ultralytics_fuse():
    from ultralytics.utils.torch_utils import fuse_conv_and_bn

    theirs, ours = _pair(128, 2, 0.5)
    theirs.eval(), ours.eval()
    for name in ("qkv", "proj", "pe"):  # what BaseModel.fuse() does to each Conv
        m = getattr(theirs, name)
        m.conv = fuse_conv_and_bn(m.conv, m.bn)
        delattr(m, "bn")
        m.forward = m.forward_fuse
    ours.fuse()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(1, 128, 6, 6, dtype=torch.float64)
    _assert_close(ours(x), theirs(x))
    fresh = PSAAttention(128, 2).double().fuse()
    fresh.load_state_dict(theirs.state_dict(), strict=True)
    _assert_close(fresh(x), theirs(x))
    theirs.load_state_dict(fresh.state_dict(), strict=True)


@pytest.mark.parametrize("fuse", [False, True])
def test_from_ultralytics(fuse):
    theirs, _ = _pair(128, 2, 0.5)
    for m in theirs.modules():  # Ultralytics models change BN hyper-parameters at build time
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps, m.momentum = 1e-3, 0.03
    theirs.eval()
    if fuse:
        from ultralytics.utils.torch_utils import fuse_conv_and_bn

        for name in ("qkv", "proj", "pe"):
            m = getattr(theirs, name)
            m.conv = fuse_conv_and_bn(m.conv, m.bn)
            delattr(m, "bn")
            m.forward = m.forward_fuse
    ours = PSAAttention.from_ultralytics(theirs)
    assert not ours.training and next(ours.parameters()).dtype == torch.float64
    x = torch.randn(2, 128, 4, 5, dtype=torch.float64)
    _assert_close(ours(x), theirs(x))
    if not fuse:
        assert ours.qkv.bn.eps == 1e-3 and ours.qkv.bn.momentum == 0.03


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_cpu(dtype):
    theirs, ours = _pair(128, 2, 0.5)
    theirs.eval(), ours.eval()
    x = torch.randn(1, 128, 6, 7, dtype=torch.float64)
    ref = theirs(x)
    y = ours.to(dtype)(x.to(dtype))
    assert y.dtype == dtype
    # Loose bound: the whole block (three convs + attention) in low precision.
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    _assert_close(y, ref, rtol=tol)


def test_autocast_cpu_bf16():
    theirs, ours = _pair(128, 2, 0.5)
    theirs.float().eval(), ours.float().eval()
    x = torch.randn(1, 128, 6, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt, yo = theirs(x), ours(x)
    assert yo.dtype == yt.dtype
    _assert_close(yo, theirs(x), rtol=5e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_cuda(dtype):
    theirs, ours = _pair(128, 2, 0.5)
    theirs.float().cuda().eval(), ours.float().cuda().eval()
    x = torch.randn(2, 128, 20, 20, device="cuda")  # N = 400, the 640 px P5 map
    ref = theirs.double()(x.double())
    with torch.autocast("cuda", dtype=dtype):
        y = ours(x)
        y_eager = theirs.float()(x)
    assert y.dtype == y_eager.dtype == dtype
    err = (y.double() - ref).abs().max().item()
    err_eager = (y_eager.double() - ref).abs().max().item()
    assert err <= 2 * err_eager + 1e-6, (err, err_eager)


# --- export paths ----------------------------------------------------------------------


def _forbid_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("psa_attention must not run on this path")

    monkeypatch.setattr(psa_nn, "psa_attention", boom)


@pytest.mark.parametrize("which", ["layer", "patched"])
def test_coreml_format_keeps_ultralytics_sdpa_branch(which, monkeypatch):
    theirs, ours = _pair(128, 2, 0.5)
    theirs.eval(), ours.eval()
    x = torch.randn(1, 128, 5, 5, dtype=torch.float64)
    theirs.format = "coreml"  # what their exporter does for format="coreml"
    ref = theirs(x)
    if which == "patched":
        ours = copy.deepcopy(theirs)
        assert patch_ultralytics(ours) == 1
        ours.format = None
        y_kernel = ours(x)  # kernel path while not exporting
        _assert_close(y_kernel, ref)
    ours.format = "coreml"
    _forbid_kernel(monkeypatch)
    _assert_close(ours(x), ref)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
def test_attention_without_format_as_in_ultralytics_8_3(monkeypatch):
    """Ultralytics 8.3's Attention has no ``format`` (8.4 added the class attribute for its
    CoreML export): a patched block there runs our op rather than failing on the attribute."""
    torch.manual_seed(0)
    block = Attention(64, 2).double().eval()
    x = torch.randn(2, 64, 6, 7, dtype=torch.float64)
    with torch.no_grad():
        expected = block(x)
    monkeypatch.delattr(Attention, "format")
    patch_ultralytics(block)
    with torch.no_grad():
        out = block(x)
    assert ((out - expected).abs().max() / expected.abs().max()).item() <= 1e-9


def test_jit_trace_records_eager_math(monkeypatch):
    theirs, _ = _pair(64, 1, 0.5)
    theirs.eval()
    patch_ultralytics(theirs)
    x = torch.randn(1, 64, 4, 4, dtype=torch.float64)
    _forbid_kernel(monkeypatch)
    traced = torch.jit.trace(theirs, x, check_trace=False)
    foreign = {n.kind() for n in traced.inlined_graph.nodes()} - {""}
    assert all(k.startswith(("aten::", "prim::")) for k in foreign), sorted(foreign)
    _assert_close(traced(x), theirs.__class__._psa_fa2_base.forward(theirs, x))


# --- whole models ----------------------------------------------------------------------

MODELS = ["yolo11n.yaml", "yolo26n.yaml", "yolov10n.yaml"]


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(cfg):
        if cfg not in cache:
            torch.manual_seed(0)
            m = DetectionModel(cfg, verbose=False)
            _randomize_bn(m, torch.Generator().manual_seed(0))
            cache[cfg] = m.double()
        return copy.deepcopy(cache[cfg])

    return get


@pytest.mark.parametrize("cfg", MODELS)
def test_patch_model_float64(cfg, models):
    model = models(cfg).eval()
    want = sum(isinstance(m, Attention) for m in model.modules())
    assert want >= 1
    x = torch.randn(2, 3, 128, 160, dtype=torch.float64)  # P5 map 4x5: N = 20
    with torch.no_grad():
        ref = model(x)
    sd_before = {k: v.clone() for k, v in model.state_dict().items()}

    assert patch_ultralytics(model) == want
    assert patch_ultralytics(model) == 0  # idempotent
    assert all(is_patched(m) for m in model.modules() if isinstance(m, Attention))
    assert not model.training and next(model.parameters()).dtype == torch.float64
    with torch.no_grad():
        _assert_close(model(x), ref)
    assert all(torch.equal(v, sd_before[k]) for k, v in model.state_dict().items())

    assert unpatch_ultralytics(model) == want
    assert not any(is_patched(m) for m in model.modules())
    assert all(type(m) is Attention for m in model.modules() if isinstance(m, Attention))
    with torch.no_grad():
        _assert_close(model(x), ref)


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo26n.yaml"])
def test_patch_model_train_grads_float64(cfg, models):
    ref_model = models(cfg).train()
    model = copy.deepcopy(ref_model)
    assert patch_ultralytics(model) >= 1 and model.training
    x = torch.randn(2, 3, 96, 96, dtype=torch.float64)
    outs = [m(x) for m in (ref_model, model)]
    _assert_close(outs[1], outs[0])
    for m, out in zip((ref_model, model), outs):
        sum((t * t).mean() for t in _flat(out)).backward()
    _assert_grads_close(model, ref_model)


def test_patch_after_ultralytics_fuse(models):
    model = models("yolo11n.yaml").eval()
    model.fuse(verbose=False)
    x = torch.randn(1, 3, 128, 128, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        with patched(model):
            assert any(is_patched(m) for m in model.modules())
            y = model(x)
        assert not any(is_patched(m) for m in model.modules())
    _assert_close(y, ref)


def test_patched_context_restores_only_what_it_switched(models):
    model = models("yolo26n.yaml")
    first = next(m for m in model.modules() if isinstance(m, Attention))
    patch_ultralytics(first)
    with patched(model):
        assert all(is_patched(m) for m in model.modules() if isinstance(m, Attention))
    assert is_patched(first)
    assert sum(is_patched(m) for m in model.modules()) == 1


def test_deepcopy_keeps_patch_pickle_writes_plain_class(models):
    model = models("yolo11n.yaml").eval()
    patch_ultralytics(model)
    assert any(is_patched(m) for m in copy.deepcopy(model).modules())
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"psa_fa2_ext" not in buf.getvalue()  # loads where psa_fa2_ext is absent
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert not any(is_patched(m) for m in loaded.modules())
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        _assert_close(loaded(x), model(x))


def test_yolo_object_patches_the_training_model():
    from types import SimpleNamespace

    from ultralytics import YOLO

    from psa_fa2_ext.patch import _CALLBACK_EVENT, _patch_trainer_model

    yolo = YOLO("yolo11n.yaml")  # built from the yaml: no download
    assert patch_ultralytics(yolo) == 1
    assert _patch_trainer_model in yolo.callbacks[_CALLBACK_EVENT]
    # YOLO.train() builds a new model and an EMA copy; the callback gets the trainer.
    fresh = DetectionModel("yolo11n.yaml", verbose=False)
    trainer = SimpleNamespace(model=fresh, ema=SimpleNamespace(ema=copy.deepcopy(fresh)))
    _patch_trainer_model(trainer)
    assert any(is_patched(m) for m in trainer.model.modules())
    assert any(is_patched(m) for m in trainer.ema.ema.modules())
    assert unpatch_ultralytics(yolo) == 1
    assert _patch_trainer_model not in yolo.callbacks[_CALLBACK_EVENT]


def test_trainer_whose_validator_has_no_get_model_as_in_ultralytics_8_3():
    """Ultralytics 8.3's validator has no get_model hook (8.4 added it): the callback patches
    the trainer's model and EMA and leaves the validator alone (its final validation of the
    best checkpoint then runs Ultralytics' attention) instead of failing the trainer's setup."""
    from types import SimpleNamespace

    from psa_fa2_ext.patch import _patch_trainer_model

    fresh = DetectionModel("yolo11n.yaml", verbose=False)
    validator = SimpleNamespace()
    trainer = SimpleNamespace(model=fresh, ema=SimpleNamespace(ema=copy.deepcopy(fresh)),
                              validator=validator)
    _patch_trainer_model(trainer)
    assert any(is_patched(m) for m in trainer.model.modules())
    assert any(is_patched(m) for m in trainer.ema.ema.modules())
    assert not hasattr(validator, "get_model")


def test_subclass_with_own_forward_is_left_alone():
    class Custom(Attention):
        def forward(self, x):
            return super().forward(x) * 2

    block = torch.nn.Sequential(Attention(64, 1), Custom(64, 1))
    with pytest.warns(UserWarning, match="Custom"):
        assert patch_ultralytics(block) == 1
    assert is_patched(block[0]) and not is_patched(block[1])


# --- torch.compile ---------------------------------------------------------------------


def test_torch_compile_patched_block():
    """A patched C2PSA (the block YOLO11/26 wrap around Attention), fullgraph.

    Inference through inductor (C++ codegen on CPU); training through ``aot_eager``,
    which runs the same AOTAutograd trace of forward + backward (fake tensors, the
    op's autograd formula) without a second minute of C++ compilation.
    """
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = C2PSA(128, 128, n=1)
    _randomize_bn(block, torch.Generator().manual_seed(0))
    block.eval()
    assert patch_ultralytics(block) == 1
    x = torch.randn(1, 128, 6, 7)
    with torch.no_grad():
        ref = block(x)
        y = torch.compile(block, fullgraph=True)(x)
    _assert_close(y, ref, rtol=1e-4)

    block.train()
    xg = x.clone().requires_grad_()
    torch.compile(block, fullgraph=True, backend="aot_eager")(xg).square().mean().backward()
    xr = x.clone().requires_grad_()
    block(xr).square().mean().backward()
    _assert_close(xg.grad, xr.grad, rtol=1e-4, what="input grad")
