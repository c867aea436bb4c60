"""Switch the ``Attention`` blocks of an Ultralytics model to our kernel, in place, and back.

How: each ``Attention`` instance gets its class swapped for a subclass whose ``forward``
is ``attention_forward``. The module object, its children (Ultralytics ``Conv``), its
parameters, buffers, hooks, device, dtype and train/eval mode are untouched, so

- weights and optimiser state stay attached (a module swap would need the parent's
  attribute rewritten and breaks references users hold);
- ``isinstance(m, Attention)`` still holds, so Ultralytics' exporter still finds the
  block and sets ``m.format = "coreml"`` before a CoreML export, and ``model.fuse()``
  still folds the children's BatchNorms;
- with ``format == "coreml"``, while ONNX export / TorchScript tracing records the
  graph, and on a device without our kernels (``mps``, ``xpu``, ...; one warning), the
  patched forward runs Ultralytics' own ``forward`` unchanged.

Copies: ``copy.deepcopy`` (Ultralytics' EMA, ``AutoBackend``) keeps the patch;
pickling (``torch.save`` of a checkpoint) writes the plain Ultralytics class, so a
checkpoint of a patched model loads where psa_fa2_ext is not installed, unpatched.

Training: ``YOLO.train()`` trains a model it builds itself, so on a ``YOLO`` object the
patch also registers a trainer callback that patches that model, its EMA and the model the
trainer's final validation loads from the best checkpoint (through the validator's
``get_model``, which Ultralytics 8.3 lacks: there that validation runs unpatched); and the
``YOLO`` object's class is swapped the same way, for one whose ``train()`` patches the model
that Ultralytics reloads from that checkpoint at its end. ``predict()`` keeps a copy of the
model in a predictor after its first call: patching and unpatching a ``YOLO`` object reach that
copy too. Multi-GPU training
(``device="0,1"``) trains in new processes: Ultralytics (``utils/dist.py``,
``generate_ddp_file``) pickles the trainer's class, args, model and callbacks with
cloudpickle and each rank rebuilds the trainer from them. The model arrives unpatched
(pickled as above, or as the yaml the rank builds it from); the callback arrives by
reference, imports psa_fa2_ext in the rank, and patches the rank's model and EMA before the
first step (docs/multi_gpu.md).

Ultralytics is imported only when a function here is called.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
import functools
import warnings
from collections.abc import Iterator
from pathlib import PurePath

from torch import nn

from .blocks import aattn_forward, mha_forward, runs_on_our_op
from .nn import _keeps_ultralytics_forward, attention_forward

__all__ = ["is_patched", "patch_ultralytics", "patched", "unpatch_ultralytics"]

_PATCHED: dict[type, type] = {}  # Ultralytics class -> its patched subclass


class _SwappedClass:
    """A patched subclass, put in place of an object's Ultralytics class: pickled as that class,
    kept by deepcopy."""

    _psa_fa2_base: type  # the Ultralytics class this patches

    def __reduce_ex__(self, protocol):
        # Pickle as the Ultralytics class: the checkpoint does not name psa_fa2_ext.
        # ``copyreg.__newobj__`` refuses a class other than the object's own, so use the
        # reconstructor that pickle protocols 0/1 emit for every object: it is
        # ``object.__new__(base)``, then the state is applied as usual.
        state = object.__reduce_ex__(self, 2)[2]
        return copyreg._reconstructor, (self._psa_fa2_base, object, None), state

    def __deepcopy__(self, memo):
        # deepcopy would otherwise go through ``__reduce_ex__`` above and lose the patch.
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new


class _PatchedBlock(_SwappedClass):
    """A block running on our kernels."""


class _FA2AttentionMixin(_PatchedBlock):
    """Put before an Ultralytics ``Attention`` class in the bases of a patched class."""

    def forward(self, x):
        # Their exporter sets ``format = "coreml"`` to get an SDPA graph: keep their
        # forward (both branches) for that, for graph recorders that can't see our op and on
        # devices without our kernels. (8.3's Attention has no ``format``.)
        if getattr(self, "format", None) == "coreml" or _keeps_ultralytics_forward(x):
            return super().forward(x)
        return attention_forward(self, x)


class _FA2AAttnMixin(_PatchedBlock):
    """Put before YOLO12's ``AAttn`` in the bases of a patched class."""

    def forward(self, x):
        if _keeps_ultralytics_forward(x):
            return super().forward(x)
        return aattn_forward(self, x)


class _FA2MultiheadAttentionMixin(_PatchedBlock):
    """Put before ``nn.MultiheadAttention`` in the bases of the class of an ``AIFI``'s ``ma``."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if _keeps_ultralytics_forward(query) or not runs_on_our_op(
                self, query, key, value, key_padding_mask, attn_mask, is_causal):
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        return mha_forward(self, query, key, value)


class _FA2ModelMixin(_SwappedClass):
    """Put before an Ultralytics ``Model`` class (``YOLO``, ``RTDETR``, ...) in the bases of a
    patched class."""

    def train(self, *args, **kwargs):
        # Ultralytics' Model.train() is its training entry point (not nn.Module.train): it ends
        # by loading the best checkpoint into self.model, pickled unpatched. Patch it again.
        metrics = super().train(*args, **kwargs)
        patch_ultralytics(self)
        return metrics


def _attention_class() -> type:
    try:
        from ultralytics.nn.modules.block import Attention
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "psa_fa2_ext.patch needs the 'ultralytics' package: pip install -r requirements-ultralytics.txt"
        ) from e
    return Attention


def _patched_class(cls: type, mixin: type = _FA2AttentionMixin) -> type:
    new = _PATCHED.get(cls)
    if new is None:
        new = type(
            f"PSAFA2{cls.__name__}",
            (mixin, cls),
            {"_psa_fa2_base": cls, "__module__": __name__, "__qualname__": f"PSAFA2{cls.__name__}"},
        )
        _PATCHED[cls] = new
    return new


def is_patched(module: nn.Module) -> bool:
    """Whether ``module`` is an Ultralytics attention block (``Attention``, ``AAttn``, an
    ``AIFI``'s ``nn.MultiheadAttention``) running on our kernel."""
    return isinstance(module, _PatchedBlock)


class PatchCount(int):
    """How many blocks a patch switched (an int), and of which kind (``by_kind``)."""

    by_kind: dict

    def __new__(cls, by_kind: dict):
        count = super().__new__(cls, sum(by_kind.values()))
        count.by_kind = {kind: n for kind, n in by_kind.items() if n}
        return count

    def __repr__(self):
        kinds = ", ".join(f"{kind}: {n}" for kind, n in self.by_kind.items())
        return f"{int(self)} ({kinds})" if kinds else "0"


def _block_classes() -> dict:
    """{Ultralytics class: (mixin, kind)} of the blocks patched directly; AIFI's attention is
    reached through its ``ma``."""
    classes = {_attention_class(): (_FA2AttentionMixin, "Attention")}
    try:
        from ultralytics.nn.modules.block import AAttn
        classes[AAttn] = (_FA2AAttnMixin, "AAttn")
    except ImportError:  # pragma: no cover - an Ultralytics older than YOLO12
        pass
    return classes


def _aifi_class():
    try:
        from ultralytics.nn.modules.transformer import AIFI
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return AIFI


def _ultralytics_model_class():
    try:
        from ultralytics.engine.model import Model
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return Model


def _predictor_model(model: nn.Module) -> nn.Module | None:
    """The copy of the model in the predictor a ``YOLO`` object's first predict() made: the
    PyTorch model inside its ``AutoBackend`` (whose runtime backend is not a submodule)."""
    predictor = model.__dict__.get("predictor")
    inner = getattr(getattr(predictor, "model", None), "model", None)
    return inner if isinstance(inner, nn.Module) else None


def _switch_blocks(model: nn.Module) -> PatchCount:
    classes = _block_classes()
    aifi = _aifi_class()
    counts = {kind: 0 for _, kind in classes.values()}
    counts["AIFI"] = 0
    skipped = set()
    for m in list(model.modules()):
        if aifi is not None and isinstance(m, aifi):
            ma = getattr(m, "ma", None)
            if type(ma) is nn.MultiheadAttention:
                ma.__class__ = _patched_class(nn.MultiheadAttention, _FA2MultiheadAttentionMixin)
                counts["AIFI"] += 1
            continue
        if is_patched(m):
            continue
        for base, (mixin, kind) in classes.items():
            if isinstance(m, base):
                # A subclass with its own forward may compute something else: left alone.
                if type(m).forward is not base.forward:
                    skipped.add(type(m).__qualname__)
                else:
                    m.__class__ = _patched_class(type(m), mixin)
                    counts[kind] += 1
                break
    if skipped:
        warnings.warn(f"patch_ultralytics: left {sorted(skipped)} alone: they override the "
                      "block's forward", stacklevel=3)
    return PatchCount(counts)


def _unswitch_blocks(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        if is_patched(m):
            m.__class__ = m._psa_fa2_base
            n += 1
    return n


def _patched_validation_model(get_model, model, trainer=None, **kwargs):
    """The trainer's validator's get_model, patched: the final validation loads the best
    checkpoint by path (unpatched); load it here instead and patch it."""
    model = get_model(model, trainer, **kwargs)
    if trainer is None and isinstance(model, (str, PurePath)):
        try:
            from ultralytics.nn.tasks import load_checkpoint
        except ImportError:  # pragma: no cover - an Ultralytics without it validates unpatched
            return model
        model, _ = load_checkpoint(model)
    if isinstance(model, nn.Module):
        _switch_blocks(model)
    return model


def _patch_trainer_model(trainer) -> None:
    # ``YOLO.train()`` builds a fresh model from the yaml and loads the weights into it,
    # which drops the patch. This runs at the end of the trainer's setup, after
    # compile/DDP wrapping (both are lazy, and ``modules()`` sees through them) and
    # after the EMA copy is taken, so both are patched before the first step. It runs in
    # every DDP rank too, whose trainer gets the callbacks by pickle: it must stay a
    # module-level function, which cloudpickle pickles by name, not by value.
    patch_ultralytics(trainer.model)
    ema = getattr(getattr(trainer, "ema", None), "ema", None)
    if isinstance(ema, nn.Module):
        patch_ultralytics(ema)
    validator = getattr(trainer, "validator", None)
    # Ultralytics 8.3's validator has no get_model to hook: there the final validation of the
    # best checkpoint loads it by path and runs Ultralytics' own attention.
    if (validator is not None and hasattr(validator, "get_model")
            and "get_model" not in vars(validator)):
        validator.get_model = functools.partial(_patched_validation_model, validator.get_model)


_CALLBACK_EVENT = "on_pretrain_routine_end"


def _callbacks(model: nn.Module) -> list:
    # ``YOLO`` objects keep ``callbacks: dict[event, list[fn]]``; other modules have none.
    callbacks = getattr(model, "callbacks", None)
    return callbacks.get(_CALLBACK_EVENT, []) if isinstance(callbacks, dict) else []


def _has_callback(model: nn.Module) -> bool:
    return _patch_trainer_model in _callbacks(model)


def _remove_callback(model: nn.Module) -> None:
    cbs = _callbacks(model)
    while _patch_trainer_model in cbs:
        cbs.remove(_patch_trainer_model)


def patch_ultralytics(model: nn.Module) -> PatchCount:
    """Run every Ultralytics attention block in ``model`` on our kernel; returns how many were
    switched (an int; ``.by_kind`` per block kind).

    ``model`` is any ``nn.Module``: a ``DetectionModel`` (or other task model), a
    ``YOLO`` object, or a single block. The blocks: ``Attention`` (YOLOv10 ``PSA``,
    YOLO11 / YOLO26 ``C2PSA``, ``C3k2(attn=True)``), YOLO12's area attention ``AAttn``, and
    the ``nn.MultiheadAttention`` of RT-DETR's ``AIFI`` (calls with masks or training dropout
    keep PyTorch's). Modules already patched are not counted again. A subclass that
    overrides the block's ``forward`` is left alone (its math may differ), with a warning.

    On a ``YOLO`` object the patch also holds through ``train()`` (the trained model, its EMA,
    the final validation and the model reloaded from the best checkpoint, in each process of
    a multi-GPU run as well), and reaches the predictor an earlier ``predict()`` made.
    """
    n = _switch_blocks(model)
    model_class = _ultralytics_model_class()
    if model_class is not None and isinstance(model, model_class):
        if not isinstance(model, _FA2ModelMixin):
            model.__class__ = _patched_class(type(model), _FA2ModelMixin)
        predictor_model = _predictor_model(model)
        if predictor_model is not None:
            _switch_blocks(predictor_model)
    if hasattr(model, "add_callback") and not _has_callback(model):
        model.add_callback(_CALLBACK_EVENT, _patch_trainer_model)
    return n


def unpatch_ultralytics(model: nn.Module) -> int:
    """Undo ``patch_ultralytics``: every patched block gets its Ultralytics class back; returns how many."""
    n = _unswitch_blocks(model)
    _unpatch_model_object(model)
    _remove_callback(model)
    return n


def _unpatch_model_object(model: nn.Module) -> None:
    """A ``YOLO`` object's own class back, and its predictor's copy of the model unpatched."""
    if isinstance(model, _FA2ModelMixin):
        model.__class__ = model._psa_fa2_base
    predictor_model = _predictor_model(model)
    if predictor_model is not None:
        _unswitch_blocks(predictor_model)


@contextlib.contextmanager
def patched(model: nn.Module) -> Iterator[nn.Module]:
    """``with patched(model): ...`` runs the block on our kernel and restores the blocks it switched on exit."""
    if isinstance(model, _FA2ModelMixin):  # already patched as a whole: leave it so
        yield model
        return
    before = {id(m) for m in model.modules() if is_patched(m)}
    had_callback = _has_callback(model)
    patch_ultralytics(model)
    try:
        yield model
    finally:
        for m in model.modules():
            if is_patched(m) and id(m) not in before:
                m.__class__ = m._psa_fa2_base
        _unpatch_model_object(model)
        if not had_callback:
            _remove_callback(model)
