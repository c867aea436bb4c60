"""A training callback that records, in every process that trains, how many of the model's
Ultralytics ``Attention`` blocks run on our kernel.

It lives in a module of its own so that it is pickled by reference: Ultralytics' DDP launch
carries the YOLO object's callbacks to the rank processes with cloudpickle, which pickles a
function of an importable module by name (one of ``__main__`` would go by value, and its
globals with it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

EVENT = "on_train_start"  # after on_pretrain_routine_end, where the patch callback runs


def census_file(save_dir: Path, rank: int) -> Path:
    return Path(save_dir) / f"attention_census_rank{rank}.json"


def _count(model) -> dict:
    from ultralytics.nn.modules.block import Attention

    from psa_fa2_ext.patch import is_patched

    blocks = [m for m in model.modules() if isinstance(m, Attention)]
    return {"attention": len(blocks), "patched": sum(is_patched(m) for m in blocks),
            "classes": sorted({type(m).__name__ for m in blocks})}


def record(trainer) -> None:
    """Writes ``{rank, model, ema}`` counts to ``census_file(trainer.save_dir, rank)``; a
    process outside DDP is rank 0."""
    rank = int(os.environ.get("RANK", "0"))
    ema = getattr(getattr(trainer, "ema", None), "ema", None)
    census = {"rank": rank, "pid": os.getpid(), "model": _count(trainer.model),
              "ema": _count(ema) if ema is not None else None}
    path = census_file(trainer.save_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)  # rank 0 makes the run's folder, maybe later
    path.write_text(json.dumps(census))
