"""Fused FlashAttention-2 attention for the Ultralytics YOLO attention block (PSA / C2PSA).

>>> out = psa_fa2_ext.psa_attention(q, k, v)   # q, k: [B, H, dk, N], v: [B, H, dv, N]
"""
import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C
from .nn import PSAAttention
from .ops import attention, bwd, fwd, psa_attention
from .patch import is_patched, patch_ultralytics, patched, unpatch_ultralytics

__version__ = _C.build_info()["version"]

__all__ = [
    "attention", "psa_attention", "fwd", "bwd", "build_info", "__version__",
    "PSAAttention", "patch_ultralytics", "unpatch_ultralytics", "patched", "is_patched",
]


def build_info() -> dict:
    """Version, the torch it was built against, which CUDA kernels and archs were built, and
    the instruction set the CPU kernels run on this machine ("avx512", "avx2" or "baseline")."""
    return dict(_C.build_info())
