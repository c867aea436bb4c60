"""Trains yolo11n for one epoch on a tiny dataset the way a user would, for
tests/test_ultralytics_ddp.py. A script, so that Ultralytics' process-wide state (seeds,
deterministic mode, its DDP temp files) stays out of the test process.

    python tests/ultralytics_train.py DATA_YAML OUT_DIR [--patch] [--device D] [--amp A]
                                      [--launch train|ddp-file]

``--patch`` calls ``patch_ultralytics`` on the YOLO object before training. Either way a
callback (attention_census.py) records in every process that trains how many attention
blocks are patched.

``--launch train`` (default) calls ``model.train``; with ``--device 0,1`` Ultralytics spawns
its DDP ranks itself. ``--launch ddp-file`` does what that launch does, minus the GPUs: the
trainer ``model.train`` builds is kept just before it would train, Ultralytics'
``generate_ddp_file`` writes the rank script and the pickled state it loads, and the script
runs in a new process as each rank runs it (torchrun adds only the rank environment, which on
the CPU would ask for a process group Ultralytics makes on CUDA only).

Writes OUT_DIR/result.json: this process's pid, the run's save_dir, the rows of its
results.csv and, for ddp-file, what the state file carried to the rank (describe_state).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from ultralytics import YOLO
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.utils.dist import ddp_cleanup, generate_ddp_file

import attention_census
from psa_fa2_ext import patch_ultralytics


class _Kept(Exception):
    """Carries the trainer out of ``model.train`` before it trains."""

    def __init__(self, trainer):
        super().__init__("trainer kept")
        self.trainer = trainer


def _keep(trainer):
    raise _Kept(trainer)


def run_ddp_file(model: YOLO, train_args: dict) -> tuple[Path, dict]:
    # YOLO.train() makes the trainer (with the YOLO object's callbacks) and calls its train();
    # BaseTrainer.train is where a DDP launch would write the file.
    BaseTrainer.train = _keep
    try:
        model.train(**train_args)
    except _Kept as kept:
        trainer = kept.trainer
    else:
        raise RuntimeError("YOLO.train() returned without calling BaseTrainer.train")
    file = generate_ddp_file(trainer)
    try:
        carried = describe_state(Path(file).with_suffix(".pt"))
        subprocess.run([sys.executable, file], check=True)
    finally:
        ddp_cleanup(trainer, file)
    return Path(trainer.save_dir), carried


def describe_state(path: Path) -> dict:
    """What the rank script will load from the state file: the model's type (a module, or
    the yaml the rank builds it from) and the callbacks of the patch's event, by name."""
    from ultralytics.utils.patches import torch_load

    from psa_fa2_ext.patch import _CALLBACK_EVENT

    state = torch_load(path, map_location="cpu")
    return {"model": type(state["model"]).__name__,
            "callbacks": [f"{cb.__module__}.{cb.__qualname__}"
                          for cb in state["callbacks"].get(_CALLBACK_EVENT, [])]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--patch", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="fp32")
    parser.add_argument("--launch", choices=("train", "ddp-file"), default="train")
    args = parser.parse_args()

    model = YOLO("yolo11n.yaml")  # built from the yaml: no download
    if args.patch:
        patch_ultralytics(model)
    model.add_callback(attention_census.EVENT, attention_census.record)
    # 8 images, batch 4: each of 2 ranks (or the one process) takes 2 batches, and the
    # optimizer steps once, after both (accumulate = min(nbs / batch, batches) = 2), so every
    # logged loss is computed at the same initial weights. Seeded and deterministic, so runs
    # differ only where their arithmetic does. No plots: they fetch a font.
    train_args = dict(data=str(args.data), epochs=1, imgsz=160, batch=4, workers=0,
                      device=args.device, amp=args.amp, seed=0, deterministic=True,
                      plots=False, val=False, project=str(args.out.resolve()), name="run",
                      exist_ok=True, verbose=False)
    carried = None
    if args.launch == "ddp-file":
        save_dir, carried = run_ddp_file(model, train_args)
    else:
        model.train(**train_args)
        save_dir = Path(model.trainer.save_dir)
    results = save_dir / "results.csv"
    rows = list(csv.DictReader(results.open())) if results.exists() else []
    rows = [{k.strip(): v.strip() for k, v in row.items()} for row in rows]
    (args.out / "result.json").write_text(json.dumps({"pid": os.getpid(), "save_dir": str(save_dir),
                                                         "carried": carried, "results": rows}))


if __name__ == "__main__":
    main()
