"""GPUs that run none of this build's kernels (a T4, compute capability 7.5; a GPU the build's
archs have no code for) take the blockwise path on at::matmul: correct, a one-time warning,
never an error unless impl="fast" asks for a kernel. No such GPU is at hand, so the plan is
told the visible GPU is one (psa_fa2_ext._testing.force(as_if_no_kernels=True)); what runs is
then exactly what runs there, torch's matmuls on the same device."""
import pytest
import torch

import psa_fa2_ext
from helpers import LAYOUTS, check_backward, check_forward, requires_cuda
from psa_fa2_ext import _testing

pytestmark = requires_cuda

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def no_kernels():
    with _testing.force(as_if_no_kernels=True):
        yield


@pytest.mark.parametrize("N", [1, 97, 400, 1025])
@pytest.mark.parametrize("dk,dv", [(32, 64), (32, 32), (48, 48)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_and_backward_without_kernels(N, dk, dv, layout, dtype, no_kernels):
    check_forward("cuda", "auto", N, dk, dv, dtype, layout)
    check_backward("cuda", "auto", N, dk, dv, dtype, layout)


def test_no_kernels_warns_and_fast_raises(no_kernels):
    q = torch.randn(1, 2, 64, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="runs none of this build's kernels"):
        torch.ops.psa_fa2.fwd(q, q, q, 0.2, "fast")
    out, _ = torch.ops.psa_fa2.fwd(q, q, q, 0.2, "reference")  # no kernel, no error
    assert torch.isfinite(out).all()


def test_patched_model_runs_without_kernels(no_kernels):
    ultralytics = pytest.importorskip("ultralytics")  # noqa: F841
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolo11n.yaml", verbose=False).cuda().eval()
    x = torch.randn(1, 3, 128, 128, device="cuda")
    with torch.no_grad():
        expected = model(x)[0]
        assert psa_fa2_ext.patch_ultralytics(model) == 1
        got = model(x)[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
