"""Calls of more than 65535 (batch, head) pairs, the most a CUDA grid's y dimension holds:
the CUDA ops run them as several launches (csrc/cuda/grid_chunks.h), of whole batches or, where
one batch has more heads than that, of one batch's heads. Each case checks every output
element against float64 (outputs start as NaN), so a launch that misses or overlaps a piece
of the call fails."""
import pytest
import torch

from helpers import check_backward, check_forward, requires_cuda
from psa_fa2_ext import _testing

# Batch x heads: launches of whole batches (the first two) and of one batch's heads (the last).
SPLITS = [(70000, 1), (17501, 4), (1, 70001)]
N = 17  # odd: partial tiles in every launch


@pytest.mark.parametrize("heads", SPLITS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
def test_cpu_beyond_65535_pairs(heads, layout):
    check_forward("cpu", "auto", 5, 32, 64, torch.float32, layout, heads=heads)
    check_backward("cpu", "auto", 5, 32, 64, torch.float32, layout, heads=heads)


# The kernels a call of this shape runs on Hopper (auto), on Ampere and the 99 KB GPUs
# (no_sm90), the exact fp32 kernels, and the reference kernels.
PATHS = [
    ("auto", torch.bfloat16, {}),
    ("auto", torch.float16, {"no_sm90": True}),
    ("auto", torch.float32, {}),
    ("reference", torch.bfloat16, {}),
]


@requires_cuda
@pytest.mark.parametrize("heads", SPLITS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["channel_first", "token_major"])
@pytest.mark.parametrize("impl, dtype, overrides", PATHS,
                         ids=[f"{i}-{str(d)[6:]}-{'_'.join(o) or 'plan'}" for i, d, o in PATHS])
def test_cuda_beyond_65535_pairs(heads, layout, impl, dtype, overrides):
    assert torch.get_float32_matmul_precision() == "highest"  # fp32: the exact kernels
    with _testing.force(**overrides):
        check_forward("cuda", impl, N, 32, 64, dtype, layout, heads=heads)
        check_backward("cuda", impl, N, 32, 64, dtype, layout, heads=heads)
