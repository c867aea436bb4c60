"""``PSAAttention``: a drop-in for Ultralytics' ``Attention`` (YOLOv10 PSA, YOLO11/26 C2PSA).

It has the constructor, attributes, submodule names and state_dict keys of
``ultralytics.nn.modules.block.Attention``, so checkpoints load both ways with
``strict=True``, and it runs the N x N part on our fused kernel instead of
materialising the attention matrix. Ultralytics is not imported here: the conv
blocks are rebuilt below to the same structure.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

from .ops import psa_attention

__all__ = ["PSAAttention", "attention_forward"]


class _ConvBN(nn.Module):
    """Ultralytics' ``Conv(c1, c2, k, 1, g=g, act=False)``, rebuilt without importing it.

    Theirs is ``conv`` (``nn.Conv2d``, ``bias=False``, padding ``autopad(k) == k // 2``)
    -> ``bn`` (``nn.BatchNorm2d(c2)``, torch defaults) -> ``act``; ``act=False`` makes
    ``act`` an ``nn.Identity``. We register the same three children in the same order
    with the same defaults, so parameter and buffer names, shapes and state_dict order
    are identical. ``Conv.default_act`` is a class attribute there, not a child, so it
    adds nothing to the state_dict and is left out.

    Ultralytics' ``BaseModel.fuse()`` folds ``bn`` into ``conv`` (which gains a bias),
    deletes ``bn`` and calls ``forward_fuse``; ``fuse()`` here leaves the same
    structure, so fused state_dicts match too.
    """

    def __init__(self, c1: int, c2: int, k: int = 1, g: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, 1, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Branch on the structure instead of rebinding ``self.forward`` as Ultralytics
        # does: an instance attribute would not survive pickling of this class.
        if "bn" not in self._modules:
            return self.forward_fuse(x)
        return self.act(self.bn(self.conv(x)))

    def forward_fuse(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))

    @torch.no_grad()
    def fuse(self) -> _ConvBN:
        """Fold BatchNorm into the conv in place, as ``ultralytics...fuse_conv_and_bn``."""
        if "bn" in self._modules:
            bn = self.bn
            w, b = fuse_conv_bn_weights(
                self.conv.weight, self.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
            )
            self.conv.weight, self.conv.bias = w, b
            self.conv.requires_grad_(False)  # theirs freezes the fused conv too
            del self.bn
        return self


def _exporting() -> bool:
    """True while ONNX export or TorchScript tracing records the graph.

    Neither can represent our custom op; the eager math they record instead is the
    same function.
    """
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


# The device types our operators run on: CPU and CUDA kernels, and meta (the fake kernels).
_OP_DEVICE_TYPES = frozenset({"cpu", "cuda", "meta"})
_warned_device_types: set[str] = set()


def _keeps_ultralytics_forward(x: torch.Tensor) -> bool:
    """Whether an attention block runs Ultralytics' own forward on ``x`` instead of ours.

    While export or tracing records the graph (``_exporting``); and on a device our operators
    have no kernels for (Apple's ``mps``, Intel's ``xpu``, ...), where the block stays usable
    with Ultralytics' math, as if unpatched, after one warning per device type, rather than
    failing in the dispatcher in the middle of a model.
    """
    if _exporting():
        return True
    device_type = x.device.type
    if device_type in _OP_DEVICE_TYPES:
        return False
    if device_type not in _warned_device_types:
        _warned_device_types.add(device_type)
        warnings.warn(f"psa_fa2_ext has kernels for CPU and CUDA tensors, not {device_type!r} "
                      f"ones: attention blocks on {device_type!r} run Ultralytics' own attention",
                      stacklevel=3)
    return True


def attention_forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The body of ``Attention.forward`` with the N x N part on ``psa_attention``.

    ``m`` is anything with Ultralytics' attribute names (``PSAAttention`` or a patched
    Ultralytics ``Attention``). q, k, v stay strided views of the qkv conv output
    (stride of N == 1); ``psa_attention`` reads them in place and returns
    ``[B, nh, hd, N]`` contiguous, so the ``view`` back to NCHW is free.
    """
    B, C, H, W = x.shape
    N = H * W
    qkv = m.qkv(x)
    q, k, v = qkv.view(B, m.num_heads, m.key_dim * 2 + m.head_dim, N).split([m.key_dim, m.key_dim, m.head_dim], dim=2)
    # Their eager code applies ``m.scale`` (== key_dim ** -0.5 unless a user changed
    # it), so pass it rather than letting the op derive the default.
    o = psa_attention(q, k, v, m.scale)
    x = o.view(B, C, H, W) + m.pe(v.reshape(B, C, H, W))
    return m.proj(x)


def _reference_forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Ultralytics' ``Attention.forward`` verbatim (8.4.x), both branches.

    Used for export and on devices without our kernels (``_keeps_ultralytics_forward``), and
    for ``format == "coreml"``, which their exporter sets on every ``Attention`` before a
    CoreML export so that the graph uses ``F.scaled_dot_product_attention``.
    """
    B, C, H, W = x.shape
    N = H * W
    qkv = m.qkv(x)
    q, k, v = qkv.view(B, m.num_heads, m.key_dim * 2 + m.head_dim, N).split([m.key_dim, m.key_dim, m.head_dim], dim=2)
    if m.format == "coreml" and hasattr(F, "scaled_dot_product_attention"):
        x = F.scaled_dot_product_attention(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1))
        x = x.transpose(-2, -1).reshape(B, C, H, W) + m.pe(v.reshape(B, C, H, W))
    else:
        attn = ((q * m.scale).transpose(-2, -1) @ k).softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(B, C, H, W) + m.pe(v.reshape(B, C, H, W))
    return m.proj(x)


class PSAAttention(nn.Module):
    """Multi-head self-attention over the H*W positions of a feature map.

    Same signature and parameters as ``ultralytics.nn.modules.block.Attention``:
    ``qkv`` (1x1 conv to ``num_heads * (2 * key_dim + head_dim)`` channels), ``pe``
    (3x3 depthwise conv on v, a positional term), ``proj`` (1x1 conv), each conv + BN
    without activation. Runs our kernels on CPU and CUDA, in every dtype ``psa_attention``
    supports, and under autocast (the op casts like matmul); on other devices (``mps``, ...)
    Ultralytics' math, with a warning.

    Args:
        dim: channels of the input (and output); must be divisible by ``num_heads``.
        num_heads: attention heads (Ultralytics uses ``max(dim // 64, 1)``).
        attn_ratio: ``key_dim / head_dim`` (0.5 in every shipped model).
    """

    format = None  # Set to "coreml" to take Ultralytics' SDPA branch, as their exporter does.

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim**-0.5
        nh_kd = self.key_dim * num_heads
        h = dim + nh_kd * 2
        self.qkv = _ConvBN(dim, h, 1)
        self.proj = _ConvBN(dim, dim, 1)
        self.pe = _ConvBN(dim, dim, 3, g=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.format == "coreml" or _keeps_ultralytics_forward(x):
            return _reference_forward(self, x)
        return attention_forward(self, x)

    def fuse(self) -> PSAAttention:
        """Fold every BatchNorm into its conv, leaving what Ultralytics' ``model.fuse()`` leaves."""
        for c in (self.qkv, self.proj, self.pe):
            c.fuse()
        return self

    @classmethod
    def from_ultralytics(cls, module: nn.Module) -> PSAAttention:
        """A ``PSAAttention`` equal to an Ultralytics ``Attention`` (fused or not).

        Copies weights, BN hyper-parameters (Ultralytics models set eps/momentum at
        build time; they are not in the state_dict), device, dtype, train/eval mode and
        ``format``.
        """
        dim = module.proj.conv.out_channels
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.num_heads, new.head_dim, new.key_dim, new.scale = (
            module.num_heads,
            module.head_dim,
            module.key_dim,
            module.scale,
        )
        h = module.qkv.conv.out_channels
        new.qkv, new.proj, new.pe = _ConvBN(dim, h, 1), _ConvBN(dim, dim, 1), _ConvBN(dim, dim, 3, g=dim)
        for name in ("qkv", "proj", "pe"):
            theirs, ours = getattr(module, name), getattr(new, name)
            if not hasattr(theirs, "bn"):
                ours.fuse()
            else:
                ours.bn.eps, ours.bn.momentum = theirs.bn.eps, theirs.bn.momentum
        ref = next(module.parameters())
        new.to(device=ref.device, dtype=ref.dtype)
        new.load_state_dict(module.state_dict(), strict=True)
        for name in ("qkv", "proj", "pe"):  # fused convs are frozen in theirs: keep that
            for p_new, p_old in zip(getattr(new, name).parameters(), getattr(module, name).parameters()):
                p_new.requires_grad_(p_old.requires_grad)
        if "format" in vars(module):
            new.format = module.format
        return new.train(module.training)
