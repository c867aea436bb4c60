"""Shared by the kernel generators (generate_*.py): one .cu per instantiation, and no
leftovers, since setup.py builds every csrc/cuda/*.cu it finds."""
import re
from pathlib import Path


def remove_stale(directory: Path, pattern: str, keep: set) -> None:
    """Deletes the generated files (names matching `pattern` in full) not in `keep`."""
    regex = re.compile(pattern)
    for path in directory.glob("*.cu"):
        if regex.fullmatch(path.name) and path.name not in keep:
            path.unlink()
            print("removed", path.name)
