"""Model-level benchmark: Ultralytics' eager attention vs psa_fa2_ext, YOLO11 n/s/m by default;
YOLO12 (area attention) and RT-DETR (AIFI) by name (``--models yolo12n rtdetr-l``).

For each model (random weights from the yaml, nothing downloaded):
- one AMP training step (fp16 autocast + GradScaler, channels_last, forward +
  Ultralytics' detection loss + backward + SGD step, as their trainer does) at each
  --train-sizes, and the attention blocks' part of it: each block's forward + backward timed
  alone on the inputs it got in a step (hooks capture them), summed;
- fp16 inference (BN fused, batch 1, as Ultralytics' predictor runs) at each --sizes.
Each run is timed (median of CUDA-event timings after warm-up) and its peak allocated
memory recorded, eager and patched in the same process. An eager run that runs out of
memory is reported as "OOM" (that is the point of the large sizes: at 8000 px the P5
map has N = 62 500 tokens and the eager N x N matrix alone needs ~31 GB per head in fp16).

Without a GPU it runs fp32 inference only (eval, inference_mode, batch 1) of yolo11n and
yolo11s at 640, 1280 and 2560 px, eager and patched, in the memory format Ultralytics'
predictor gives the model on this machine (channels_last on x86-64 CPUs with oneDNN under
Linux and Windows, as AutoBackend does): time per image, the time spent inside
the attention blocks (forward hooks on ``Attention``, ``AAttn`` and AIFI's
``nn.MultiheadAttention``: on a CPU every call is synchronous, so host time is their time)
and the peak RSS one call adds (rss.py, on a call of its own). The eager and
patched models' timed calls alternate, so that the machine's drift lands on both. A
training step on a CPU only with --train-sizes.

Writes ``bench/results/local/bench_model_<device>.json`` and ``.md`` (git ignores the
folder), and PNGs through ``bench/plots.py`` (model peak memory; kernel speedup from
bench_attention.py's JSON).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
try:
    import psa_fa2_ext
except ImportError:  # not installed: use the checkout this script lives in (built in place)
    sys.path.insert(0, str(HERE.parent))
    import psa_fa2_ext
from psa_fa2_ext.patch import patch_ultralytics

sys.path.insert(0, str(HERE))
import rss  # noqa: E402

MODES = ("eager", "psa_fa2")


def _progress(items, desc):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: print one line per job instead
        total = len(items)

        def plain():
            for i, it in enumerate(items, 1):
                print(f"[{desc} {i}/{total}] {it}", flush=True)
                yield it

        return plain()
    return tqdm(items, desc=desc, dynamic_ncols=True)


def _is_oom(e: BaseException) -> bool:
    # cuDNN / cuBLAS report allocation failures as plain RuntimeErrors.
    msg = str(e)
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in msg or "ALLOC_FAILED" in msg


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measure(fn, device, warmup: int, iters: int) -> tuple[float, float | None]:
    """(median ms, peak allocated MiB over the timed iterations; None on CPU)."""
    for _ in range(warmup):
        fn()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    return statistics.median(times), peak


def _attention_blocks(model):
    """The modules whose forward is the attention psa_fa2 patches: ``Attention`` (YOLOv10 / 11
    / 26), ``AAttn`` (YOLO12), and the ``nn.MultiheadAttention`` of each ``AIFI`` (RT-DETR; its
    feed-forward and norms are not attention). Patched ones too: the patch subclasses them."""
    from ultralytics.nn.modules.block import AAttn, Attention
    from ultralytics.nn.modules.transformer import AIFI

    for m in model.modules():
        if isinstance(m, (Attention, AAttn)):
            yield m
        elif isinstance(m, AIFI):
            yield m.ma


def _tokens(m, args) -> str:
    """The tokens one call of an attention block attends over: N, or N/area for AAttn."""
    x = args[0]
    n = x.shape[1] if x.dim() == 3 else x.shape[2] * x.shape[3]  # MHA is batch-first [B, N, C]
    area = getattr(m, "area", 1)
    return f"{n}/{area}" if area > 1 else f"{n}"


def _attention_timer(model):
    """(list that each attention block's forward appends its seconds to, hook handles, set of
    the token counts the blocks saw)."""
    spent, started, tokens = [], {}, set()

    def pre(m, args):
        tokens.add(_tokens(m, args))
        started[m] = time.perf_counter()

    def post(m, args, out):
        spent.append(time.perf_counter() - started.pop(m))

    handles = []
    for m in _attention_blocks(model):
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return spent, handles, tokens


def _measure_cpu(fn, model, warmup: int, iters: int) -> dict:
    """Median ms per call, median ms inside the Attention blocks, peak RSS MiB of one call."""
    for _ in range(warmup):
        fn()
    # Its own call, before the timed ones: resetting the high-water mark is not free.
    _, peak = rss.peak_added(fn) if not rss.unavailable() else (None, None)
    spent, handles, _ = _attention_timer(model)
    times, attn = [], []
    try:
        for _ in range(iters):
            spent.clear()
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            attn.append(sum(spent) * 1e3)
    finally:
        for h in handles:
            h.remove()
    return dict(time_ms=round(statistics.median(times), 3), attn_ms=round(statistics.median(attn), 3),
                peak_rss_mib=None if peak is None else round(peak / 2**20, 1))


def _blocks_train_ms(model, step, device, amp, warmup, iters) -> float:
    """Forward + backward of the attention blocks alone, each on the inputs (and keyword
    arguments) it got in one training step, under the step's autocast: the sum of their
    median times, ms. That is the part of the step the patch can change; set against the
    step's time it gives attention's share (the rest of the step is the same code in both
    modes). Timed alone, a block cannot overlap anything, and on one GPU stream nothing in the
    step overlaps it either."""
    captured = []

    def grab(m, args, kwargs):
        def leaf(a):
            if not torch.is_tensor(a):
                return a
            a = a.detach().clone()
            return a.requires_grad_() if a.is_floating_point() else a

        captured.append((m, [leaf(a) for a in args], {k: leaf(v) for k, v in kwargs.items()}))

    handles = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in _attention_blocks(model)]
    try:
        step()
    finally:
        for h in handles:
            h.remove()
    total = 0.0
    for m, args, kwargs in captured:
        leaves = [a for a in list(args) + list(kwargs.values()) if torch.is_tensor(a) and a.requires_grad]

        def forward():
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                out = m(*args, **kwargs)
            return out[0] if isinstance(out, tuple) else out

        grad = torch.randn_like(forward())

        def block():
            for a in leaves:
                a.grad = None
            forward().backward(grad)

        total += _measure(block, device, warmup, iters)[0]
    model.zero_grad(set_to_none=True)
    return total


def model_name(name: str) -> str:
    """A YOLO11 scale (n, s, m, ...) or a full name (yolo12n, rtdetr-l, ...) -> the full name."""
    return f"yolo11{name}" if len(name) == 1 else name


def build_model(name: str):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel, RTDETRDetectionModel

    torch.manual_seed(0)
    cls = RTDETRDetectionModel if name.startswith("rtdetr") else DetectionModel
    model = cls(f"{name}.yaml", verbose=False)
    model.args = get_cfg()  # the loss reads its box/cls/dfl gains from here, as in training
    model.nc = model.yaml["nc"]  # set by the trainer from the data; RT-DETR's loss reads it
    return model


def _fake_batch(bs: int, imgsz: int, device, boxes_per_image: int = 8):
    """Random images and normalised xywh boxes in the layout Ultralytics' loss expects."""
    g = torch.Generator().manual_seed(0)
    n = bs * boxes_per_image
    return {
        "img": torch.rand(bs, 3, imgsz, imgsz, generator=g).to(device),
        "batch_idx": torch.arange(bs).repeat_interleave(boxes_per_image).float().to(device),
        "cls": torch.randint(0, 80, (n, 1), generator=g).float().to(device),
        "bboxes": (torch.rand(n, 4, generator=g) * 0.5 + 0.25).to(device),
    }


def train_step(base, mode, imgsz, bs, device, amp):
    """(model, step): a copy of base in training mode (patched for mode "psa_fa2") and one
    training step of it on a fake batch, as Ultralytics' trainer runs it."""
    model = copy.deepcopy(base).to(device).train()
    if device.type == "cuda":
        # Ultralytics' trainer does this on CUDA by default (8.4): the qkv conv output is
        # then NHWC, so q, k, v reach the op as token-major views.
        model = model.to(memory_format=torch.channels_last)
    if mode == "psa_fa2":
        patch_ultralytics(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    batch = _fake_batch(bs, imgsz, device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            loss, _ = model.loss(batch)
        scaler.scale(loss.sum()).backward()
        scaler.step(opt)
        scaler.update()

    return model, step


def _train_run(base, mode, imgsz, bs, device, amp, warmup, iters):
    model, step = train_step(base, mode, imgsz, bs, device, amp)
    ms, peak = _measure(step, device, warmup, iters)
    return ms, peak, _blocks_train_ms(model, step, device, amp, warmup, iters)


def predictor_memory_format(device) -> torch.memory_format:
    """The memory format Ultralytics' predictor and validator give a PyTorch model by default
    (AutoBackend, ultralytics 8.4): channels_last on x86-64 CPUs with oneDNN under Linux or
    Windows, where its convolutions are faster; contiguous elsewhere, CUDA included. (Its
    trainer makes CUDA models channels_last instead: _train_run.)"""
    cpu_channels_last = (device.type == "cpu" and platform.machine() in {"AMD64", "x86_64"}
                         and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
                         and platform.system() in {"Linux", "Windows"})
    return torch.channels_last if cpu_channels_last else torch.contiguous_format


def _infer_run(base, mode, imgsz, device, dtype, warmup, iters):
    model = copy.deepcopy(base).eval().fuse(verbose=False).to(
        device=device, dtype=dtype, memory_format=predictor_memory_format(device))
    if mode == "psa_fa2":
        patch_ultralytics(model)
    x = torch.rand(1, 3, imgsz, imgsz, device=device, dtype=dtype)

    def fwd():
        with torch.inference_mode():
            model(x)

    if device.type == "cpu":
        return _measure_cpu(fwd, model, warmup, iters)
    return _measure(fwd, device, warmup, iters)


def _infer_pair_cpu(base, imgsz, dtype, warmup, iters):
    """{mode: columns} for eager and patched inference on a CPU, their timed calls interleaved.

    A whole model's time on a shared 2-core machine drifts by more than the attention block's
    share of it at 640 px, so the two models alternate call by call (the order flipping each
    round): drift lands on both medians alike.
    """
    models, calls = {}, {}
    x = torch.rand(1, 3, imgsz, imgsz, dtype=dtype)
    for mode in MODES:
        model = copy.deepcopy(base).eval().fuse(verbose=False).to(
            dtype=dtype, memory_format=predictor_memory_format(torch.device("cpu")))
        if mode == "psa_fa2":
            patch_ultralytics(model)
        models[mode] = model

        def fwd(model=model):
            with torch.inference_mode():
                model(x)
        calls[mode] = fwd
    out = {}
    for mode in MODES:
        for _ in range(warmup):
            calls[mode]()
        # Its own call, before the timed ones: resetting the high-water mark is not free.
        _, peak = rss.peak_added(calls[mode]) if not rss.unavailable() else (None, None)
        out[mode] = dict(times=[], attn=[], peak_rss_mib=None if peak is None else round(peak / 2**20, 1))
    timers = {mode: _attention_timer(models[mode]) for mode in MODES}
    tokens = timers["eager"][2]
    try:
        for i in range(iters):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                spent = timers[mode][0]
                spent.clear()
                t = time.perf_counter()
                calls[mode]()
                out[mode]["times"].append((time.perf_counter() - t) * 1e3)
                out[mode]["attn"].append(sum(spent) * 1e3)
    finally:
        for _, handles, _ in timers.values():
            for h in handles:
                h.remove()
    attn_n = " · ".join(sorted(tokens, key=lambda t: -int(t.split("/")[0])))
    return {mode: dict(time_ms=round(statistics.median(r["times"]), 3),
                       attn_ms=round(statistics.median(r["attn"]), 3), peak_rss_mib=r["peak_rss_mib"],
                       attn_n=attn_n)
            for mode, r in out.items()}


def _cpu_iters(imgsz):
    """Timed rounds per size on a CPU: enough for a stable median where a call is short."""
    return 9 if imgsz <= 640 else 5 if imgsz <= 1280 else 3


def _run(job, fn, rows, device):
    row = dict(job)
    try:
        res = fn()
        if isinstance(res, dict):  # CPU inference: its own columns
            row.update(status="ok", peak_mib=None, **res)
        else:  # (ms, peak MiB) or, for a training step, (ms, peak MiB, attention blocks' ms)
            ms, peak = res[:2]
            row.update(status="ok", time_ms=round(ms, 3), peak_mib=None if peak is None else round(peak, 1))
            if len(res) > 2:
                row.update(attn_ms=round(res[2], 3))
    except Exception as e:  # noqa: BLE001 - one failed configuration must not end the run
        row.update(
            status="OOM" if _is_oom(e) else f"error: {type(e).__name__}: {str(e)[:200]}", time_ms=None, peak_mib=None
        )
    _free(device)
    rows.append(row)


def _family(model: str) -> str:
    # yolo11n -> YOLO11, rtdetr-l -> RT-DETR
    return "RT-DETR" if model.startswith("rtdetr") else model.rstrip("nsmlx").upper()


def _pairs(rows, keys):
    """Group eager / psa_fa2 rows of the same configuration."""
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), {})[r["mode"]] = r
    return out


def _fmt(r, field):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"] if r["status"] == "OOM" else "error"
    v = r.get(field)
    return "n/a" if v is None else f"{v:,.1f}"


def _ratio(a, b, field):
    if a and b and a["status"] == b["status"] == "ok" and a[field] and b[field]:
        return f"{a[field] / b[field]:.2f}x"
    return "-"


def _share(r):
    """The attention blocks' share of a training step's time."""
    if r and r["status"] == "ok" and r.get("attn_ms") is not None and r["time_ms"]:
        return f"{r['attn_ms'] / r['time_ms']:.0%}"
    return "-"


def markdown(results: dict) -> str:
    meta = results["meta"]
    cpu_rows = any("attn_ms" in r for r in results["infer"])
    memory = (
        "memory is the peak RSS one inference call adds (activations and workspaces; the weights"
        " were resident before it), measured on a call of its own; attn is the time inside the"
        " attention blocks (Attention; YOLO12's AAttn; RT-DETR's AIFI attention,"
        " nn.MultiheadAttention, without its feed-forward), attn N the tokens a block attends"
        " over (N/area: AAttn's areas of N/area tokens each)"
        if cpu_rows
        else "memory is peak allocated (weights, activations, optimiser state)"
    )
    lines = [
        f"# {', '.join(dict.fromkeys(_family(r['model']) for r in results['train'] + results['infer']))}"
        " model benchmark: eager attention vs psa_fa2",
        "",
        f"{meta['device']} · torch {meta['torch']} · ultralytics {meta['ultralytics']} · {meta['date']}",
        "",
        f"Ratios are eager / psa_fa2 (above 1: psa_fa2 is faster or smaller). Times are medians; {memory}.",
    ]
    if results["train"]:
        lines += [
            "",
            f"## Training step ({meta['train_dtype']}, forward + loss + backward + SGD step)",
            "",
            "attn: the attention blocks' forward + backward, each timed alone on the inputs it got"
            " in the step, summed; share: attn / step.",
            "",
            "| model | imgsz | batch | P5 N | eager ms | psa_fa2 ms | speedup | eager attn ms | psa_fa2 attn ms |"
            " eager share | psa_fa2 share | eager MiB | psa_fa2 MiB | memory |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for (model, imgsz, bs), p in _pairs(results["train"], ("model", "imgsz", "batch")).items():
        e, f = p.get("eager"), p.get("psa_fa2")
        lines.append(
            f"| {model} | {imgsz} | {bs} | {(imgsz // 32) ** 2} | {_fmt(e, 'time_ms')} | {_fmt(f, 'time_ms')} | "
            f"{_ratio(e, f, 'time_ms')} | {_fmt(e, 'attn_ms')} | {_fmt(f, 'attn_ms')} | {_share(e)} | {_share(f)} | "
            f"{_fmt(e, 'peak_mib')} | {_fmt(f, 'peak_mib')} | {_ratio(e, f, 'peak_mib')} |"
        )
    memory_format = meta.get("infer_memory_format", "contiguous_format")
    lines += ["", f"## Inference ({meta['infer_dtype']}, BN fused, batch 1, {memory_format}: as"
              " Ultralytics' predictor runs it here)", ""]
    if cpu_rows:
        lines += [
            "| model | imgsz | attn N | eager ms | psa_fa2 ms | speedup | eager attn ms | psa_fa2 attn ms |"
            " attn speedup | eager RSS MiB | psa_fa2 RSS MiB | memory |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "| model | imgsz | P5 N | eager ms | psa_fa2 ms | speedup | eager MiB | psa_fa2 MiB | memory |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for (model, imgsz), p in _pairs(results["infer"], ("model", "imgsz")).items():
        e, f = p.get("eager"), p.get("psa_fa2")
        n = (e or f or {}).get("attn_n", "-") if cpu_rows else (imgsz // 32) ** 2
        cells = [model, imgsz, n, _fmt(e, "time_ms"), _fmt(f, "time_ms"), _ratio(e, f, "time_ms")]
        if cpu_rows:
            cells += [_fmt(e, "attn_ms"), _fmt(f, "attn_ms"), _ratio(e, f, "attn_ms")]
        mem = "peak_rss_mib" if cpu_rows else "peak_mib"
        cells += [_fmt(e, mem), _fmt(f, mem), _ratio(e, f, mem)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    errors = [r for r in results["train"] + results["infer"] if r["status"].startswith("error")]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {r['model']} {r['mode']} {r['imgsz']} px: {r['status']}" for r in errors]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["n", "s", "m"] if cuda else ["n", "s"],
                    help="YOLO11 scales (n, s, ...) or model names: yolo12n, yolo12s, rtdetr-l, ...")
    ap.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=[640, 1280, 4000, 8000] if cuda else [640, 1280, 2560],
        help="inference image sizes (multiples of 32)",
    )
    ap.add_argument(
        "--train-sizes",
        nargs="*",
        type=int,
        default=[640, 1280] if cuda else [],
        help="training-step image sizes (default on a CPU: none)",
    )
    ap.add_argument("--train-batch", type=int, default=16 if cuda else 1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5 if cuda else None,
                    help="timed iterations (CPU default by size: 9 at 640 px, 5 to 1280, 3 above)")
    ap.add_argument("--big", type=int, default=2000, help="sizes from here on run 1 warm-up + 2 timed iterations")
    ap.add_argument("--out", default=str(HERE / "results" / "local"))
    ap.add_argument(
        "--attention-json",
        help="bench_attention.py's JSON for the kernel plot (default: the newest one in --out)",
    )
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    for name, sizes in (("--sizes", args.sizes), ("--train-sizes", args.train_sizes)):
        if any(s <= 0 or s % 32 for s in sizes):
            ap.error(f"{name} must be positive multiples of 32 (the models' largest stride), got {sizes}")

    import ultralytics

    device = torch.device("cuda" if cuda else "cpu")
    # fp16 on CPU convs is slow and not what anyone deploys there: measure fp32 instead.
    amp, infer_dtype = cuda, torch.float16 if cuda else torch.float32
    results = {
        "meta": {
            "device": torch.cuda.get_device_name(device)
            if cuda
            else f"CPU ({platform.processor() or platform.machine()})",
            "torch": torch.__version__,
            "ultralytics": ultralytics.__version__,
            "psa_fa2_ext": getattr(psa_fa2_ext, "__version__", None),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "train_dtype": "AMP fp16" if amp else "fp32",
            "infer_dtype": str(infer_dtype).removeprefix("torch."),
            "infer_memory_format": str(predictor_memory_format(device)).removeprefix("torch."),
            "warmup": args.warmup,
            "iters": args.iters if args.iters else "9 / 5 / 3 (to 640 / 1280 px / above), eager and patched interleaved",
        },
        "train": [],
        "infer": [],
    }

    jobs = [("train", s, sz, m) for s in args.models for sz in args.train_sizes for m in MODES]
    if cuda:
        jobs += [("infer", s, sz, m) for s in args.models for sz in args.sizes for m in MODES]
    else:  # both modes in one job, interleaved (_infer_pair_cpu)
        jobs += [("infer", s, sz, "both") for s in args.models for sz in args.sizes]
    base, base_scale = None, None
    for kind, scale, imgsz, mode in _progress(jobs, "bench_model"):
        if scale != base_scale:  # build each model once, copy it per run
            base, base_scale = build_model(model_name(scale)), scale
        n_iters = args.iters or 3
        warmup, iters = (min(args.warmup, 1), min(n_iters, 2)) if imgsz >= args.big else (args.warmup, n_iters)
        job = {"model": model_name(scale), "mode": mode, "imgsz": imgsz}
        if mode == "both":
            iters = args.iters or _cpu_iters(imgsz)
            try:
                pair = _infer_pair_cpu(base, imgsz, infer_dtype, warmup, iters)
                for m in MODES:
                    results[kind].append(dict(job, mode=m, status="ok", peak_mib=None, **pair[m]))
            except Exception as e:  # noqa: BLE001 - one failed configuration must not end the run
                for m in MODES:
                    results[kind].append(dict(job, mode=m, status=f"error: {type(e).__name__}: {str(e)[:200]}",
                                              time_ms=None, peak_mib=None))
            _free(device)
            continue
        if kind == "train":
            job["batch"] = args.train_batch
            fn = functools.partial(_train_run, base, mode, imgsz, args.train_batch, device, amp, warmup, iters)
        else:
            fn = functools.partial(_infer_run, base, mode, imgsz, device, infer_dtype, warmup, iters)
        _run(job, fn, results[kind], device)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_model_{device.type}"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(results))
    print(markdown(results))
    if not args.no_plots:
        _plots(results, out, stem, args.attention_json)
    return results


def _newest_attention_json(folder: Path) -> Path | None:
    """The newest JSON in ``folder`` that bench_attention.py wrote (it has "rows"; ours has "infer")."""
    for p in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list) and "infer" not in doc:
            return p
    return None


def _plots(results, out: Path, stem: str, attention_json):
    try:
        import plots  # bench/ is on sys.path when this file runs as a script
    except ImportError:
        from bench import plots
    png = plots.plot_model_memory(results, out / f"{stem}_memory.png")
    print(f"wrote {png}" if png else "model memory plot skipped: no peak memory figures (CPU run)")
    if attention_json is None:
        attention_json = _newest_attention_json(out)
    if attention_json:
        print("wrote", plots.plot_kernel_speedup(attention_json, out / "kernel_speedup.png"))
    else:
        print("no bench_attention.py JSON found: kernel speedup plot skipped")


if __name__ == "__main__":
    main()
