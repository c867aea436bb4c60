"""The build's CUDA archs (psa_fa2_ext/_cuda_archs.py, which setup.py loads): archs the kernels
cannot be compiled for (below 8.0: no cp.async, no bf16 mma.sync) are left out of
TORCH_CUDA_ARCH_LIST instead of failing the whole build, as a T4's 7.5 did."""
import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[1] / "psa_fa2_ext" / "_cuda_archs.py"


@pytest.fixture(scope="module")
def archs():
    # By path, as setup.py loads it before the package is built.
    spec = importlib.util.spec_from_file_location("cuda_archs_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("requested, chosen, dropped", [
    ("8.0+PTX;9.0a", "8.0+PTX;9.0a", []),
    ("8.6;9.0a", "8.6;9.0a", []),
    ("7.5", "8.0+PTX;9.0a", ["7.5"]),                       # a T4 alone: the default archs
    ("7.5+PTX", "8.0+PTX;9.0a", ["7.5+PTX"]),
    ("7.0 7.5 8.0 8.6+PTX", "8.0;8.6+PTX", ["7.0", "7.5"]),  # spaces, as docker images write it
    ("6.1;7.5;8.9;9.0a;12.0", "8.9;9.0a;12.0", ["6.1", "7.5"]),
    ("Turing;Ampere", "8.0;8.6+PTX", ["7.5+PTX"]),           # torch's arch names
    ("Hopper", "9.0+PTX", []),
    ("8.0;;", "8.0", []),
    ("sm_75", "sm_75", []),                                   # not an arch: torch rejects it
])
def test_archs_below_8_are_left_out(archs, requested, chosen, dropped):
    assert archs.supported(requested) == (chosen, dropped)


@pytest.mark.parametrize("capability, arch, dropped", [
    ((7, 5), "8.0+PTX;9.0a", ["7.5"]),  # T4: no kernels; the build stays usable on newer GPUs
    ((8, 0), "8.0", []), ((8, 6), "8.6", []), ((8, 9), "8.9", []),
    ((9, 0), "9.0a", []),               # the wgmma kernels are sm_90a code
    ((12, 0), "12.0", []),
])
def test_arch_of_the_visible_gpu(archs, capability, arch, dropped):
    assert archs.for_gpu(*capability) == (arch, dropped)


def test_default_is_what_the_kernels_support(archs):
    assert archs.supported(archs.DEFAULT) == (archs.DEFAULT, [])
