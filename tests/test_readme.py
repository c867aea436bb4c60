"""Every ```python block of README.md runs as written, each in a fresh interpreter started in the
repository root (as a user who copies it would run it). A block that imports ultralytics is
skipped when ultralytics is not installed; any other failure fails the test."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks():
    text = README.read_text(encoding="utf-8")
    blocks = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        blocks.append(pytest.param(m.group(1), id=f"README.md:{line}"))
    return blocks


BLOCKS = python_blocks()


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2, "README.md should show the Python API and the Ultralytics use"


@pytest.mark.parametrize("code", BLOCKS)
def test_readme_block_runs(code):
    if re.search(r"^\s*(from|import)\s+ultralytics\b", code, re.MULTILINE) and \
            importlib.util.find_spec("ultralytics") is None:
        pytest.skip("this block needs ultralytics (pip install -r requirements-ultralytics.txt)")
    env = dict(os.environ)
    # The extension is built in place: the repository root must be importable, as it is for
    # `python -c` started there; Ultralytics must not wait on the network for its checks.
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("YOLO_OFFLINE", "1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (
        f"README block failed (exit {proc.returncode}):\n{code}\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-4000:]}")
