"""The source distribution carries every file the build needs: `pip install` of an sdist, and
`python -m build`, which builds the wheel from one, compile from it alone. setuptools puts in
only the sources setup.py lists for the machine that makes the sdist (no headers, and the CUDA
or the CPU-only sources but not both); MANIFEST.in adds the rest."""
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sdist_has_every_extension_source(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "MANIFEST.in", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    for name in ("csrc", "psa_fa2_ext"):
        shutil.copytree(ROOT / name, tree / name,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "dist")],
                   cwd=tree, check=True, capture_output=True)
    (archive,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        packed = {Path(*Path(m.name).parts[1:]).as_posix() for m in tar.getmembers() if m.isfile()}
    needed = {p.relative_to(tree).as_posix() for p in (tree / "csrc").rglob("*") if p.is_file()}
    assert needed <= packed, sorted(needed - packed)[:10]
