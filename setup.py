"""Build psa_fa2_ext._C: a CUDA extension when nvcc and a CUDA build of torch are present,
a CPU-only one otherwise.

Environment:
  TORCH_CUDA_ARCH_LIST  archs to build (default: the visible GPU's, else "8.0+PTX;9.0a"; a Hopper
                        GPU's 9.0 becomes 9.0a, which the wgmma kernels need; archs below 8.0,
                        which the kernels do not support, are left out)
  CUDA_HOME             CUDA toolkit (default: /usr/local/cuda when it has nvcc)
  MAX_JOBS              parallel compile jobs (ninja)
  PSA_FA2_FORCE_CPU=1   build the CPU-only extension even where CUDA is available
"""
import glob
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

VERSION = "0.1.0"
ROOT = Path(__file__).resolve().parent


def find_cuda_home():
    """torch's own guess prefers the nvcc on PATH, which can be a /usr/local/bin shim whose
    parent has no CUDA headers; a toolkit directory with bin/nvcc is what we want."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for home in candidates:
        if home and (Path(home) / "bin" / "nvcc").exists() and (Path(home) / "include" / "cuda.h").exists():
            return home
    return None


CUDA_HOME = find_cuda_home()
if CUDA_HOME:
    # Must be set before torch.utils.cpp_extension is imported: it reads CUDA_HOME once.
    os.environ["CUDA_HOME"] = CUDA_HOME

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

WITH_CUDA = (
    torch.version.cuda is not None
    and CUDA_HOME is not None
    and os.environ.get("PSA_FA2_FORCE_CPU", "0") != "1"
)


def load_cuda_archs():
    """psa_fa2_ext/_cuda_archs.py, by path: the package is not importable before it is built."""
    spec = importlib.util.spec_from_file_location(
        "psa_fa2_cuda_archs", ROOT / "psa_fa2_ext" / "_cuda_archs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_arch_list():
    archs = load_cuda_archs()
    requested = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if requested:
        chosen, dropped = archs.supported(requested)
    elif torch.cuda.is_available():
        chosen, dropped = archs.for_gpu(*torch.cuda.get_device_capability())
    else:
        chosen, dropped = archs.DEFAULT, []
    if dropped:
        print(f"psa_fa2_ext: no kernels for CUDA arch {', '.join(dropped)}: they need compute "
              f"capability {archs.MIN_MAJOR}.0; building for {chosen}. GPUs below "
              f"{archs.MIN_MAJOR}.0 run the ops blockwise on at::matmul.", file=sys.stderr)
    os.environ["TORCH_CUDA_ARCH_LIST"] = chosen
    return chosen


def nvidia_wheel_includes():
    """CUDA builds of torch ship CUDA library headers (cusparse.h, ...) in the nvidia-*
    wheels (nvidia/cu13/include, nvidia/*/include), and torch's CUDA headers include them.
    They go after every other include path (-idirafter), so the toolkit's own runtime
    headers, which must match nvcc, always win."""
    dirs = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            dirs += [str(p) for p in sorted(base.glob("*/include")) if p.is_dir()]
    return dirs


def extension():
    # The plan (which kernel a CUDA call runs) is plain C++: every build has it, so it can be
    # printed and tested without a GPU.
    sources = ["csrc/ops.cpp", "csrc/autograd/psa_attention.cpp", "csrc/blockwise_attention.cpp",
               "csrc/cuda/plan.cpp"]
    sources += sorted(glob.glob("csrc/cpu/*.cpp"))
    define_macros = [
        ("PSA_FA2_VERSION", f'"{VERSION}"'),
        ("PSA_FA2_TORCH_VERSION", f'"{torch.__version__}"'),
    ]
    # torch picks the C++ standard its headers need. Its ISO mode turns off the contraction
    # of a * b + c into one FMA, which the CPU tile math (csrc/cpu/tile_math_impl.h) is built on.
    cxx_flags = ["-O3", "-ffp-contract=fast"]
    if sys.platform.startswith("linux") and torch.backends.openmp.is_available():
        # at::parallel_for is a header template: without -fopenmp its OpenMP loop compiles to
        # a serial one. Only the compile flag: the GOMP symbols then bind, through libtorch's
        # own dependencies, to the OpenMP runtime torch ships, so one thread pool serves both.
        cxx_flags.append("-fopenmp")
    if not WITH_CUDA:
        sources.append("csrc/build_cpu_only.cpp")  # build_facts.h without CUDA kernels
        return CppExtension("psa_fa2_ext._C", sources, define_macros=define_macros,
                            extra_compile_args={"cxx": cxx_flags})
    archs = cuda_arch_list()
    sources += [f for f in sorted(glob.glob("csrc/cuda/*.cpp")) if f not in sources]
    sources += sorted(glob.glob("csrc/cuda/*.cu")) + sorted(glob.glob("csrc/cuda/kernels/*.cu"))
    sources += sorted(glob.glob("csrc/cuda/instances/*.cu"))
    define_macros.append(("PSA_FA2_CUDA_ARCHS", f'"{archs}"'))  # read by device_desc.cpp alone
    # Only the .cpp bindings include torch's CUDA headers; the .cu kernels need none.
    cxx_flags += [f"-idirafter{d}" for d in nvidia_wheel_includes()]
    nvcc_flags = [
        "-O3",
        "-lineinfo",
        # torch adds these to keep its own headers portable; our kernels include no torch
        # headers and want the half / bfloat16 operators.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr",
    ]
    if os.environ.get("PSA_FA2_PTXAS_VERBOSE") == "1":
        nvcc_flags.append("-Xptxas=-v")
    return CUDAExtension(
        "psa_fa2_ext._C",
        sources,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
    )


setup(
    name="psa_fa2_ext",
    version=VERSION,
    description="Fused FlashAttention-2 forward/backward kernels for the attention block of "
    "Ultralytics YOLO models (PSA / C2PSA)",
    packages=find_packages(include=["psa_fa2_ext", "psa_fa2_ext.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.10",
    install_requires=["torch>=2.4"],
)
