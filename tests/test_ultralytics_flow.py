"""A patched ``YOLO`` (or ``RTDETR``) object through Ultralytics' own flow on the CPU: train ->
val -> predict -> export, counting how many times the patched blocks run our kernel in each
step; for YOLO11 (``Attention``), YOLO12 (``AAttn``) and RT-DETR (``AIFI``).

Ultralytics replaces the model more than once along the way: the trainer builds its own model
and EMA, its final validation loads the best checkpoint from disk, ``train()`` then reloads
``YOLO.model`` from that checkpoint, and the first ``predict()`` keeps a copy of the model in a
predictor. A patch that did not follow all of these would leave some steps on Ultralytics'
attention, which the counts show.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("ultralytics")

from ultralytics import RTDETR, YOLO  # noqa: E402

import psa_fa2_ext.patch as patch_module  # noqa: E402
from psa_fa2_ext.patch import is_patched, patch_ultralytics, unpatch_ultralytics  # noqa: E402
from tiny_yolo_data import make_tiny_dataset  # noqa: E402


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts of our kernel's calls from patched blocks (Attention, YOLO12's AAttn, RT-DETR's
    AIFI attention), by the phase named in calls["phase"]."""
    calls = {"phase": None}

    def counting(real):
        def forward(module, *args):
            calls[calls["phase"]] = calls.get(calls["phase"], 0) + 1
            return real(module, *args)
        return forward

    for name in ("attention_forward", "aattn_forward", "mha_forward"):
        monkeypatch.setattr(patch_module, name, counting(getattr(patch_module, name)))
    return calls


# (config, its attention blocks): YOLO11's one C2PSA Attention, YOLO12's AAttn blocks and
# RT-DETR's AIFI (through Ultralytics' RTDETR class, with its own trainer and predictor).
MODELS = [("yolo11n.yaml", 1), ("yolo12n.yaml", 8), ("rtdetr-l.yaml", 1)]


@pytest.mark.parametrize("config,blocks", MODELS, ids=[c.removesuffix(".yaml") for c, _ in MODELS])
def test_patch_holds_through_train_val_predict_export(tmp_path, kernel_calls, config, blocks):
    # Ultralytics' trainer reads its results back with polars, a dependency of its own that
    # an install without dependencies (as on an offline GPU machine) lacks.
    pytest.importorskip("polars", reason="Ultralytics' trainer needs polars")
    data = make_tiny_dataset(tmp_path / "data", n_train=4, n_val=2, size=64)
    yolo = (RTDETR if config.startswith("rtdetr") else YOLO)(config)
    assert patch_ultralytics(yolo) == blocks

    validations = []  # one entry per validation run inside train(): epoch 1, then best.pt

    def on_val_start(validator):
        kernel_calls["phase"] = f"val{len(validations)}"
        validations.append(kernel_calls["phase"])

    def on_val_end(validator):
        kernel_calls["phase"] = "train"

    yolo.add_callback("on_val_start", on_val_start)
    yolo.add_callback("on_val_end", on_val_end)
    kernel_calls["phase"] = "train"
    yolo.train(data=str(data), epochs=1, imgsz=64, batch=2, device="cpu", workers=0, amp=False,
               plots=False, project=str(tmp_path / "runs"), name="train", exist_ok=True,
               verbose=False)
    assert kernel_calls.get("train", 0) > 0, kernel_calls
    assert len(validations) == 2, validations  # the epoch's and the final one of best.pt
    assert all(kernel_calls.get(name, 0) > 0 for name in validations), kernel_calls
    # train() reloaded YOLO.model from best.pt: patched again.
    assert any(is_patched(m) for m in yolo.model.modules())

    kernel_calls["phase"] = "val"
    yolo.val(data=str(data), imgsz=64, batch=2, device="cpu", workers=0, plots=False,
             project=str(tmp_path / "runs"), name="val", exist_ok=True, verbose=False)
    assert kernel_calls.get("val", 0) > 0, kernel_calls

    image = torch.rand(1, 3, 64, 64)
    kernel_calls["phase"] = "predict"
    yolo.predict(image, imgsz=64, device="cpu", verbose=False)
    assert kernel_calls.get("predict", 0) == blocks, kernel_calls

    # The predictor made by that first predict() keeps its own copy of the model: unpatching
    # and patching the YOLO object must reach it.
    assert unpatch_ultralytics(yolo) == blocks
    kernel_calls["phase"] = "predict_unpatched"
    yolo.predict(image, imgsz=64, device="cpu", verbose=False)
    assert kernel_calls.get("predict_unpatched", 0) == 0, kernel_calls
    assert patch_ultralytics(yolo) == blocks
    kernel_calls["phase"] = "predict_patched_again"
    yolo.predict(image, imgsz=64, device="cpu", verbose=False)
    assert kernel_calls.get("predict_patched_again", 0) == blocks, kernel_calls

    # Export records Ultralytics' own forward: the exported graph has no psa_fa2 op (the
    # exporter's dry runs before tracing may run ours; they are not recorded).
    kernel_calls["phase"] = "export"
    exported = yolo.export(format="torchscript", imgsz=64, device="cpu", verbose=False)
    graph = torch.jit.load(exported)
    code = "\n".join(m.code for m in graph.modules() if hasattr(m, "code"))
    assert "psa_fa2" not in code and "aten::softmax" in str(graph.inlined_graph)
    assert any(is_patched(m) for m in yolo.model.modules())


def test_unpatched_yolo_object_runs_ultralytics_attention_everywhere(tmp_path, kernel_calls):
    """The control: without the patch, none of the steps above reach our kernel."""
    yolo = YOLO("yolo11n.yaml")
    patch_ultralytics(yolo)
    unpatch_ultralytics(yolo)
    assert type(yolo) is YOLO
    kernel_calls["phase"] = "predict"
    yolo.predict(torch.rand(1, 3, 64, 64), imgsz=64, device="cpu", verbose=False)
    assert kernel_calls.get("predict", 0) == 0, kernel_calls
