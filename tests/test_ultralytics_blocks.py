"""YOLO12's area attention (``AAttn``) and RT-DETR's ``AIFI`` patched, against Ultralytics' own
blocks as the oracle: float64 on the CPU, outputs and every input and parameter gradient within
1e-9 relative, in train and eval mode, on square and non-square maps, area 1 and 4."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("ultralytics")

from ultralytics.nn.modules.block import AAttn  # noqa: E402
from ultralytics.nn.modules.transformer import AIFI  # noqa: E402
from ultralytics.nn.tasks import DetectionModel, RTDETRDetectionModel  # noqa: E402

import psa_fa2_ext.blocks as blocks  # noqa: E402
from psa_fa2_ext.patch import is_patched, patch_ultralytics, unpatch_ultralytics  # noqa: E402

RTOL64 = 1e-9


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def randomize_bn(module, gen):
    """BatchNorm statistics and affine terms away from the identity, so that every path of
    the block carries weight (a fresh BatchNorm in eval mode passes its input almost unchanged,
    and a block whose attention output is ~0 would match anything)."""
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen, dtype=torch.float64) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen, dtype=torch.float64) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen, dtype=torch.float64))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen, dtype=torch.float64) * 0.1)


def flatten(out):
    """The tensors of a model's output (tensors, lists, tuples and dicts of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [t for item in (out or []) for t in flatten(item)] if isinstance(out, (list, tuple)) else []


def compare(theirs, ours, *inputs):
    """Outputs and the gradients of every input and parameter, ours against theirs."""
    leaves_t = [x.clone().requires_grad_() for x in inputs]
    leaves_o = [x.clone().requires_grad_() for x in inputs]
    out_t, out_o = theirs(*leaves_t), ours(*leaves_o)
    out_t = out_t[0] if isinstance(out_t, tuple) else out_t
    out_o = out_o[0] if isinstance(out_o, tuple) else out_o
    assert rel_err(out_o, out_t) <= RTOL64
    g = torch.randn_like(out_t)
    grads_t = torch.autograd.grad(out_t, leaves_t + list(theirs.parameters()), g)
    grads_o = torch.autograd.grad(out_o, leaves_o + list(ours.parameters()), g)
    # Relative to the largest gradient of the call: some parameters' true gradient is 0 (a
    # BatchNorm's shift in training mode feeds a mean that the next one subtracts), and
    # both sides then hold round-off alone.
    scale = max(t.abs().max().item() for t in grads_t)
    for a, b in zip(grads_o, grads_t):
        assert (a - b).abs().max().item() <= RTOL64 * max(b.abs().max().item(), 1e-3 * scale)


@pytest.mark.parametrize("dim, heads, area", [(64, 2, 1), (64, 2, 4), (384, 12, 4), (128, 4, 1)])
@pytest.mark.parametrize("hw", [(8, 8), (4, 12), (12, 4)])
@pytest.mark.parametrize("train", [True, False])
def test_aattn_matches_ultralytics_float64(dim, heads, area, hw, train):
    gen = torch.Generator().manual_seed(dim + area)
    theirs = AAttn(dim, heads, area).double()
    randomize_bn(theirs, gen)
    theirs.train(train)
    ours = copy.deepcopy(theirs)
    assert patch_ultralytics(ours) == 1 and is_patched(ours)
    x = torch.randn(2, dim, *hw, generator=gen, dtype=torch.float64)
    compare(theirs, ours, x)


@pytest.mark.parametrize("area", [1, 4])
def test_aattn_channels_last_matches_ultralytics_float64(area):
    """A channels_last model (Ultralytics' trainer on CUDA) hands the block a channels_last
    qkv: its views are token-major, and the patched block still matches."""
    gen = torch.Generator().manual_seed(area)
    theirs = AAttn(64, 2, area).double().to(memory_format=torch.channels_last)
    randomize_bn(theirs, gen)
    ours = copy.deepcopy(theirs)
    patch_ultralytics(ours)
    x = torch.randn(2, 64, 8, 12, generator=gen, dtype=torch.float64)
    compare(theirs, ours, x.contiguous(memory_format=torch.channels_last))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_aattn_hands_pe_v_in_the_models_memory_format(memory_format):
    """The copy of v that pe convolves is in the model's memory format (Ultralytics' is
    contiguous, which a channels_last pe then converts: one more copy)."""
    block = AAttn(64, 2, 4).double().to(memory_format=memory_format)
    patch_ultralytics(block)
    seen = []
    block.pe.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    x = torch.randn(2, 64, 8, 12, dtype=torch.float64).contiguous(memory_format=memory_format)
    block(x)
    assert seen[0].is_contiguous(memory_format=memory_format)


def test_aattn_attention_carries_weight():
    """The comparison above can fail: zeroing the attention moves the block's output a lot."""
    gen = torch.Generator().manual_seed(0)
    block = AAttn(64, 2, 4).double().eval()
    randomize_bn(block, gen)
    x = torch.randn(2, 64, 8, 8, generator=gen, dtype=torch.float64)
    patch_ultralytics(block)
    with torch.no_grad():
        full = block(x)
        real = blocks.psa_attention
        blocks.psa_attention = lambda q, k, v, scale, area: torch.zeros_like(v).contiguous()
        try:
            without = block(x)
        finally:
            blocks.psa_attention = real
    assert rel_err(without, full) > 0.05


def test_aattn_without_all_head_dim_as_in_ultralytics_8_3():
    """Ultralytics 8.3's AAttn has no ``all_head_dim`` (8.4 adds it, and sets it on blocks
    unpickled from 8.3 checkpoints); the patched block computes it as 8.4 does. Checked
    against the 8.4 block before the attribute goes: the same weights and input."""
    gen = torch.Generator().manual_seed(3)
    theirs = AAttn(64, 2, 4).double().eval()
    randomize_bn(theirs, gen)
    x = torch.randn(2, 64, 8, 12, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        expected = theirs(x)
    ours = copy.deepcopy(theirs)
    del ours.all_head_dim
    patch_ultralytics(ours)
    with torch.no_grad():
        assert rel_err(ours(x), expected) <= RTOL64


def test_aattn_raises_where_ultralytics_does():
    block = AAttn(64, 2, 4).double()
    ours = copy.deepcopy(block)
    patch_ultralytics(ours)
    x = torch.randn(1, 64, 3, 3, dtype=torch.float64)  # 9 tokens, 4 areas
    with pytest.raises(RuntimeError, match="invalid for input of size"):  # their reshape's
        block(x)
    with pytest.raises(RuntimeError, match=r"area = 4 must divide the sequence length N = 9"):
        ours(x)


@pytest.mark.parametrize("c1, heads", [(256, 8), (384, 8)])
@pytest.mark.parametrize("hw", [(4, 4), (4, 8)])
@pytest.mark.parametrize("train", [True, False])
def test_aifi_matches_ultralytics_float64(c1, heads, hw, train):
    gen = torch.Generator().manual_seed(c1)
    theirs = AIFI(c1, 2 * c1, heads).double()
    theirs.train(train)
    ours = copy.deepcopy(theirs)
    counts = patch_ultralytics(ours)
    assert counts == 1 and counts.by_kind == {"AIFI": 1} and is_patched(ours.ma)
    x = torch.randn(2, c1, *hw, generator=gen, dtype=torch.float64)
    compare(theirs, ours, x)


def test_aifi_with_dropout_in_training_keeps_pytorch_attention(monkeypatch):
    block = AIFI(64, 128, 4, dropout=0.1).double().train()
    patch_ultralytics(block)
    monkeypatch.setattr(blocks, "attention", lambda *a: pytest.fail("dropout needs PyTorch's"))
    block(torch.randn(1, 64, 4, 4, dtype=torch.float64))


# The smallest of each family in train and eval mode on square and non-square maps; the
# larger scales (their blocks' head counts and widths) once each, which keeps CI's time.
MODELS = ([(cfg, kind, hw, train) for cfg, kind in (("yolo12n.yaml", AAttn), ("rtdetr-l.yaml", AIFI))
           for hw in ((64, 64), (64, 96)) for train in (False, True)]
          + [(f"yolo12{s}.yaml", AAttn, (64, 96), False) for s in "smlx"]
          + [("rtdetr-x.yaml", AIFI, (96, 64), True)])


@pytest.mark.parametrize("cfg, kind, hw, train", MODELS,
                         ids=[f"{c}-{h}x{w}-{'train' if t else 'eval'}" for c, _, (h, w), t in MODELS])
def test_models_match_ultralytics_float64(cfg, kind, hw, train):
    """Whole models from yaml, BatchNorms randomized so that attention carries weight."""
    gen = torch.Generator().manual_seed(1)
    cls = RTDETRDetectionModel if cfg.startswith("rtdetr") else DetectionModel
    theirs = cls(cfg, verbose=False).double().train(train)
    randomize_bn(theirs, gen)
    ours = copy.deepcopy(theirs)
    kinds = {kind.__name__: sum(isinstance(m, kind) for m in theirs.modules())}
    counts = patch_ultralytics(ours)
    assert counts.by_kind == kinds and min(kinds.values()) >= 1, counts
    x = torch.randn(2, 3, *hw, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        out_t, out_o = theirs(x), ours(x)
    flat_t, flat_o = flatten(out_t), flatten(out_o)
    assert len(flat_t) == len(flat_o) > 0
    for a, b in zip(flat_o, flat_t):
        assert rel_err(a, b) <= RTOL64
    assert unpatch_ultralytics(ours) == sum(kinds.values())


def test_devices_without_kernels_keep_ultralytics_forward(monkeypatch):
    """On a device our operators have no kernels for (Apple's mps, Intel's xpu), every patched
    block and PSAAttention run Ultralytics' own forward, after one warning per device type,
    instead of failing in the dispatcher. Simulated on the CPU: the CPU taken off the list of
    device types with kernels, and every call into our attention ops made to fail."""
    from ultralytics.nn.modules.block import Attention

    import psa_fa2_ext.nn as psa_nn

    monkeypatch.setattr(psa_nn, "_OP_DEVICE_TYPES", frozenset({"cuda", "meta"}))
    monkeypatch.setattr(psa_nn, "_warned_device_types", set())

    def boom(*args, **kwargs):
        raise AssertionError("our attention op ran on a device without kernels")

    for module, name in ((blocks, "psa_attention"), (blocks, "attention"),
                         (psa_nn, "psa_attention")):
        monkeypatch.setattr(module, name, boom)
    gen = torch.Generator().manual_seed(0)
    cases = [(Attention(128, num_heads=2), (1, 128, 6, 6)), (AAttn(128, 4, area=4), (1, 128, 8, 8)),
             (AIFI(64, 128, 4), (1, 64, 4, 4))]
    with pytest.warns(UserWarning, match="not 'cpu' ones") as caught:
        for theirs, shape in cases:
            theirs = theirs.double().eval()
            randomize_bn(theirs, gen)
            ours = copy.deepcopy(theirs)
            assert patch_ultralytics(ours) == 1
            x = torch.randn(*shape, generator=gen, dtype=torch.float64)
            assert torch.equal(ours(x), theirs(x))
        layer = psa_nn.PSAAttention.from_ultralytics(cases[0][0])
        x = torch.randn(1, 128, 6, 6, generator=gen, dtype=torch.float64)
        assert torch.equal(layer(x), cases[0][0](x))
    assert len([w for w in caught if "psa_fa2_ext has kernels" in str(w.message)]) == 1
