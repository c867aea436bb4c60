"""Skip conditions of the tests that need two GPUs, and the subprocess environment of those
that launch processes (torchrun, Ultralytics' DDP)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import CUDA_SKIP_REASON, HAS_CUDA

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

GPUS = torch.cuda.device_count() if HAS_CUDA else 0

requires_two_gpus = pytest.mark.skipif(
    GPUS < 2,
    reason=f"needs 2 CUDA GPUs: {CUDA_SKIP_REASON}" if not HAS_CUDA
    else f"needs 2 CUDA GPUs, {GPUS} visible")

requires_nccl = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_nccl_available()),
    reason="this torch has no NCCL backend for torch.distributed")


def subprocess_env(**extra: str) -> dict:
    """The environment for a launched process: psa_fa2_ext and the test helpers importable
    (the in-place build is found from the repository root), plus ``extra``."""
    path = os.pathsep.join(p for p in (str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}
