"""Forward and backward against the float64 reference, on CPU and on the CUDA reference
kernels, in both layouts."""
import pytest
import torch

from helpers import HEAD_DIMS, LAYOUTS, SEQLENS, check_backward, check_forward, requires_cuda

CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]

matrix = pytest.mark.parametrize("N", SEQLENS)
dims = pytest.mark.parametrize("dk,dv", HEAD_DIMS, ids=[f"{a}x{b}" for a, b in HEAD_DIMS])
layouts = pytest.mark.parametrize("layout", LAYOUTS)


@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_forward_cpu(N, dk, dv, dtype, layout):
    check_forward("cpu", "auto", N, dk, dv, dtype, layout)


@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_backward_cpu(N, dk, dv, dtype, layout):
    check_backward("cpu", "auto", N, dk, dv, dtype, layout)


@requires_cuda
@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_forward_cuda_reference(N, dk, dv, dtype, layout):
    check_forward("cuda", "reference", N, dk, dv, dtype, layout)


@requires_cuda
@matrix
@dims
@layouts
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_backward_cuda_reference(N, dk, dv, dtype, layout):
    check_backward("cuda", "reference", N, dk, dv, dtype, layout)


@requires_cuda
@pytest.mark.parametrize("N", [1025, 4097])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_reference_fp32_long(N, layout):
    """fp32 reference kernels agree with float64 within 1e-5 relative up to N = 4097."""
    check_forward("cuda", "reference", N, 32, 64, torch.float32, layout)
    check_backward("cuda", "reference", N, 32, 64, torch.float32, layout)
