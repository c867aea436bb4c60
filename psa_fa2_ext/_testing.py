"""Hooks for the tests, never for users: they force a code path that the machine would not
pick by itself, so the tests can run it."""
import contextlib

from . import _C


@contextlib.contextmanager
def cpu_isa(isa: str):
    """Run the CPU kernels' "baseline" or "avx2" copy of their tile math inside the block
    (the CPU's own choice again after it)."""
    _C._force_cpu_isa(isa)
    try:
        yield
    finally:
        _C._force_cpu_isa("auto")
