"""A patched YOLO trains under Ultralytics' own multi-GPU launch (``device="0,1"``).

Ultralytics does not hand the model to its DDP ranks: ``generate_ddp_file`` pickles the
trainer class, its args, its model and its callbacks (cloudpickle) and writes a script that
rebuilds the trainer from them in each rank process, and the model that trains is rebuilt or
unpickled there (pickling writes our blocks as the plain Ultralytics class). The patch
reaches the ranks through the callback ``patch_ultralytics`` registers on the YOLO object: it
travels with the callbacks and patches the rank's model (and its EMA) at the end of setup.

The first test proves that path on the CPU, with Ultralytics' own generate_ddp_file and its
script; the second trains on two GPUs and skips without them. Each training runs in a
process of its own (tests/ultralytics_train.py).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ultralytics")
# Ultralytics' DDP launch pickles the trainer with it, and pip-installs it if it is missing.
pytest.importorskip("cloudpickle", minversion="3.1.1",
                    reason="Ultralytics' DDP launch needs cloudpickle>=3.1.1 (requirements-ultralytics.txt)")

from attention_census import census_file  # noqa: E402
from tiny_yolo_data import make_tiny_dataset  # noqa: E402
from two_gpus import TESTS, requires_nccl, requires_two_gpus, subprocess_env  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_tiny_dataset(tmp_path_factory.mktemp("tiny_yolo"))


def _train(out: Path, data: Path, *args: str, timeout: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # Ultralytics' settings and DDP temp files in the test's folder; no network.
    env = subprocess_env(YOLO_CONFIG_DIR=str(out / "yolo_config"), YOLO_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(TESTS / "ultralytics_train.py"), str(data), str(out), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return json.loads((out / "result.json").read_text())


def _census(save_dir: str, rank: int) -> dict:
    path = census_file(Path(save_dir), rank)
    assert path.exists(), f"rank {rank} did not record its attention blocks ({path} missing)"
    return json.loads(path.read_text())


def _train_losses(result: dict) -> dict[str, float]:
    (row,) = result["results"]  # one epoch
    losses = {k: float(v) for k, v in row.items() if k.startswith("train/")}
    assert losses and all(math.isfinite(v) for v in losses.values()), row
    return losses


def _assert_all_patched(census: dict) -> None:
    for which in ("model", "ema"):
        blocks = census[which]
        assert blocks["attention"] >= 1 and blocks["patched"] == blocks["attention"], (which, census)
        assert blocks["classes"] == ["PSAFA2Attention"], (which, census)


def test_patch_survives_ultralytics_ddp_rank_script(tmp_path, data):
    """The rank script Ultralytics writes for a patched YOLO, run in a new process on the
    CPU, trains a model whose attention blocks (and EMA's) are ours."""
    result = _train(tmp_path, data, "--patch", "--launch", "ddp-file", timeout=900)
    # The patch's callback rides in the pickled state; the model does not carry the patch
    # (a yaml YOLO's rank builds its model from the yaml: the state holds the file name).
    assert "psa_fa2_ext.patch._patch_trainer_model" in result["carried"]["callbacks"], result["carried"]
    census = _census(result["save_dir"], 0)
    assert census["pid"] != result["pid"], "the model trained in the launching process"
    _assert_all_patched(census)
    _train_losses(result)


@requires_two_gpus
@requires_nccl
def test_patched_yolo_trains_on_two_gpus_like_unpatched(tmp_path, data):
    """``model.train(device="0,1")``: both ranks train patched blocks, and the losses match
    an unpatched run.

    Tolerance: seeded, deterministic, and with every logged loss taken before the one
    optimizer step (ultralytics_train.py), runs differ only by rounding, and so do patched and
    unpatched runs in bf16: ours and Ultralytics' eager attention round differently. How much
    rounding moves these losses is measured by Ultralytics' own model in bf16 against fp32;
    changing one block's arithmetic may move them at most twice that.
    """
    runs = {name: _train(tmp_path / name, data, "--device", "0,1", *flags, timeout=900)
            for name, flags in (("fp32", ["--amp", "fp32"]), ("bf16", ["--amp", "bf16"]),
                                ("patched_bf16", ["--patch", "--amp", "bf16"]))}
    for name, result in runs.items():
        censuses = [_census(result["save_dir"], rank) for rank in (0, 1)]
        assert censuses[0]["pid"] != censuses[1]["pid"] != result["pid"]
        for census in censuses:
            if name.startswith("patched"):
                _assert_all_patched(census)
            else:
                assert census["model"]["patched"] == census["ema"]["patched"] == 0, census

    fp32, bf16, patched = (_train_losses(runs[n]) for n in ("fp32", "bf16", "patched_bf16"))
    assert fp32.keys() == bf16.keys() == patched.keys()
    gap = sum(abs(bf16[k] - fp32[k]) for k in bf16)
    diff = sum(abs(patched[k] - bf16[k]) for k in bf16)
    assert diff <= 2 * gap + 1e-6 * sum(abs(v) for v in bf16.values()), (
        f"patched vs unpatched bf16: {diff:.3e}, unpatched bf16 vs fp32: {gap:.3e}; "
        f"losses {patched} / {bf16} / {fp32}")
