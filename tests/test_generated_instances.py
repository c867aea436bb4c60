"""The kernel instances checked in under csrc/cuda/instances/ are exactly what
csrc/cuda/generate_instances.py writes: edit the generator, rerun it, commit both."""
import subprocess
import sys
from pathlib import Path

GENERATOR = Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "generate_instances.py"


def test_checked_in_instances_match_the_generator():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
