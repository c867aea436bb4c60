"""Hooks for the tests, never for users: they force a code path that the machine would not
pick by itself, so the tests can run it."""
import contextlib

from . import _C


def cpu_isas() -> list[str]:
    """Every copy of the CPU kernels' tile math this CPU runs, the one it picks first: the
    baseline always, AVX2 and AVX-512 where it has them."""
    return {"avx512": ["avx512", "avx2", "baseline"],
            "avx2": ["avx2", "baseline"]}.get(_C.build_info()["cpu_isa"], ["baseline"])


@contextlib.contextmanager
def cpu_isa(isa: str):
    """Run the CPU kernels' "baseline", "avx2" or "avx512" copy of their tile math inside the
    block (the CPU's own choice again after it); a copy this CPU cannot run raises."""
    _C._force_cpu_isa(isa)
    try:
        yield
    finally:
        _C._force_cpu_isa("auto")


@contextlib.contextmanager
def force(**overrides):
    """Plan the CUDA ops' calls inside the block with csrc/cuda/plan.h's PlanOverrides:
    no_sm90 (the mma.sync kernels Ampere runs, on Hopper too), no_copies, no_f32_kv_splits,
    kv_images / stream_images ("auto", "never", "always"), kv_image_warpgroups (2 or 3),
    as_if_no_kernels (the blockwise path of GPUs that run none of this build's kernels) and
    smem_per_block (plan as on a GPU with that much shared memory per CTA, e.g. 99 KB)."""
    _C._force(overrides)
    try:
        yield
    finally:
        _C._force({})
