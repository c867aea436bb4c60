#!/usr/bin/env python
"""Benchmark psa_fa2_ext against every attention a PSA / C2PSA, YOLO12 AAttn or RT-DETR AIFI
user could pick.

    python bench/bench_attention.py                 # CPU: YOLO shapes in ~3 min; GPU: full matrix
    python bench/bench_attention.py --quick         # GPU: bf16, four shapes, ~2 min
    python bench/bench_attention.py --shapes 8x4x6400 --dtypes bf16 --peers ours sdpa_cudnn
    python bench/bench_attention.py --blocks aattn aifi   # YOLO12 area attention, RT-DETR AIFI
    python bench/bench_attention.py --blocks aattn --shapes 16x2x1600x4   # B x heads x N x area

Writes <out>.json and <out>.md (default under bench/results/local/, which git ignores) and
prints the markdown, its summary table last. Results are rewritten after every case, so a
run that is killed keeps what it finished.

The full GPU matrix (4 dtypes x 7 shapes x 9 peers x 2 modes, with torch.compile and
JIT peers) does not reliably fit one 10-minute command. Run it one dtype per command,
each stopping before its limit, then merge:

    for d in bf16 fp16 fp32 fp32-tf32; do
      python bench/bench_attention.py --dtypes $d --budget-s 420 --out bench/results/local/full-$d
    done
    python bench/report.py bench/results/local/full-*.json --out bench/results/local/full

--budget-s stops new cases from starting, and skips a row whose calls, predicted from the
rows before it (plan.py), would end after it (the report lists both; rerun them with
--shapes). --quick on GPU defaults to --budget-s 150 for the same reason. On a CPU the
YOLO shapes take seconds per call from 6400 tokens on, so the CPU default has a budget
too (--budget-s inf runs everything); a CPU row whose predicted peak memory would not fit
the machine is skipped whatever the budget.
"""
import argparse
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# After site-packages: an installed build wins, an in-place build in the checkout still works.
sys.path.append(os.path.dirname(HERE))

import layouts  # noqa: E402
import peers  # noqa: E402
from measure import (LONG_CALL_S, add_errors, eager_step_row, empty_row, free,  # noqa: E402
                     is_oom, row_seconds, run_peer, short_error)
import plan  # noqa: E402
import report  # noqa: E402
import rss  # noqa: E402
import timing  # noqa: E402
from reference import Cache, reference  # noqa: E402

GPU_SHAPES = [(16, 2, 400), (16, 4, 400), (64, 4, 400), (1, 4, 400), (16, 4, 1600),
              (8, 4, 6400), (1, 2, 62500)]
QUICK_SHAPES = [(16, 4, 400), (64, 4, 400), (16, 4, 1600), (8, 4, 6400)]
# YOLO11's attention at its P5 map (stride 32): 640 px with one image and with a batch of
# 16, 1280, 2560 and 5120 px; 2 heads is yolo11n, 4 yolo11s / m / l.
CPU_SHAPES = [(1, 2, 400), (16, 4, 400), (1, 4, 1600), (1, 4, 6400), (1, 2, 25600)]
# YOLO12's AAttn as (B, heads, N, area), head dim 32: its A2C2f blocks at P4 (stride 16,
# area 4) and P5 (stride 32, area 1); 2 heads at P4 and 4 at P5 is yolo12n, 12 at both
# yolo12x. GPU: 640 px batch 16 (the attention calls (64, 2, 400), (64, 12, 400), (16, 12,
# 400)), 1280 px batch 16 and 1 (N / area = 1600), 2560 px batch 1 (6400).
AATTN_GPU_SHAPES = [(16, 2, 1600, 4), (16, 12, 1600, 4), (16, 12, 400, 1), (16, 2, 6400, 4),
                    (16, 12, 6400, 4), (1, 2, 6400, 4), (1, 12, 6400, 4), (1, 2, 25600, 4),
                    (1, 12, 25600, 4)]
AATTN_QUICK_SHAPES = [(16, 2, 1600, 4), (16, 12, 1600, 4), (16, 12, 400, 1), (16, 2, 6400, 4)]
# CPU: one image, as a CPU user runs; yolo12n at 640 px (P4 and P5), yolo12x's P4 at 640,
# yolo12n's P4 at 640 with a batch of 16, at 1280 and at 2560 px.
AATTN_CPU_SHAPES = [(1, 2, 1600, 4), (1, 4, 400, 1), (1, 12, 1600, 4), (16, 2, 1600, 4),
                    (1, 2, 6400, 4), (1, 2, 25600, 4)]
# RT-DETR-l's AIFI at 640 px: 8 heads of 32 on the 20 x 20 P5 map; a batch of 16 (GPU), and
# one image too on a CPU.
AIFI_GPU_SHAPES = [(16, 8, 400)]
AIFI_CPU_SHAPES = [(1, 8, 400), (16, 8, 400)]
# block -> (GPU shapes, --quick GPU shapes, CPU shapes, head dims (dk, dv))
BLOCK_DEFAULTS = {
    "psa": (GPU_SHAPES, QUICK_SHAPES, CPU_SHAPES, (32, 64)),
    "aattn": (AATTN_GPU_SHAPES, AATTN_QUICK_SHAPES, AATTN_CPU_SHAPES, (32, 32)),
    "aifi": (AIFI_GPU_SHAPES, AIFI_GPU_SHAPES, AIFI_CPU_SHAPES, (32, 32)),
}
# Seconds the CPU default may spend on rows and references, so that the whole script,
# import and report included, ends within three minutes.
CPU_BUDGET_S = 170
# Of the default CPU run: no row may take longer (plan.py). Ours takes at most ~8 s a row at
# the YOLO shapes on 2 cores; a peer over this at some shape is left out there, with its
# predicted time in the row's note.
CPU_ROW_CAP_S = 12
# Shape of the probe run, once per peer, mode and dtype, before a CPU row with no smaller
# row of its own to predict its memory from.
PROBE_SHAPE = (1, 1, 1024)
# name -> (dtype, float32 matmul precision). "high" lets fp32 matmuls use TF32.
DTYPES = {"bf16": (torch.bfloat16, "highest"), "fp16": (torch.float16, "highest"),
          "fp32": (torch.float32, "highest"), "fp32-tf32": (torch.float32, "high")}
MODES = ("fwd", "fwd+bwd")


def parse_shape(s):
    parts = s.replace("x", ",").split(",")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"shape must be BxHxN or BxHxNxAREA, got {s!r}")
    shape = tuple(int(p) for p in parts)
    if len(shape) == 4 and (shape[3] < 1 or shape[2] % shape[3]):
        raise argparse.ArgumentTypeError(f"area must be >= 1 and divide N, got {s!r}")
    return shape


def parse_pair(s):
    parts = s.replace("x", ",").split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"head dims must be DKxDV, got {s!r}")
    return tuple(int(p) for p in parts)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    p.add_argument("--blocks", nargs="+", choices=layouts.BLOCKS, default=["psa"],
                   help="psa: the Attention of YOLOv10 / 11 / 26 (default); aattn: YOLO12's area "
                        "attention; aifi: RT-DETR's AIFI (layouts.py)")
    p.add_argument("--shapes", nargs="+", type=parse_shape, metavar="BxHxN[xAREA]",
                   help="for every block given; AREA (aattn only) defaults to 1")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES))
    p.add_argument("--peers", nargs="+", choices=list(peers.PEERS))
    p.add_argument("--head-dims", nargs="+", type=parse_pair, metavar="DKxDV",
                   help="default: 32x64 for psa, 32x32 for aattn and aifi (which need dk == dv)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--step", action=argparse.BooleanOptionalAction,
                   help="the eager training-step table; default: on with CUDA, off on a CPU, "
                        "where every call is synchronous and the fwd+bwd rows already time "
                        "the same autograd step")
    p.add_argument("--quick", action="store_true",
                   help="short timing; on GPU bf16 and four shapes unless --dtypes/--shapes say")
    p.add_argument("--repeats", type=int, help="timed repeats per row (median reported)")
    p.add_argument("--target-ms", type=float, help="work per timed repeat")
    p.add_argument("--budget-s", type=float,
                   help="start no new case after this many seconds, nor a row predicted to end "
                        f"after them (results so far are kept); CPU default {CPU_BUDGET_S}, "
                        "'inf' for none")
    p.add_argument("--row-cap-s", type=float,
                   help="skip a row whose calls are predicted to take longer than this; CPU "
                        f"default {CPU_ROW_CAP_S}, 'inf' for none (then every row runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="path prefix for .json/.md; default "
                                 "bench/results/local/<date>-<device>")
    args = p.parse_args(argv)
    if args.budget_s is not None and not args.budget_s > 0:
        p.error(f"--budget-s must be positive, got {args.budget_s:g}")
    if args.row_cap_s is not None and not args.row_cap_s > 0:
        p.error(f"--row-cap-s must be positive, got {args.row_cap_s:g}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if args.shapes and "aattn" not in args.blocks and any(len(s) == 4 for s in args.shapes):
        p.error("an area (BxHxNxAREA) is for --blocks aattn only")
    if args.head_dims and set(args.blocks) - {"psa"} and any(dk != dv for dk, dv in args.head_dims):
        p.error("aattn and aifi have one head dim: --head-dims must be DxD")
    return args


class Progress:
    """tqdm when installed, else one line per row on stderr."""

    def __init__(self, total):
        self.total, self.done = total, 0
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def step(self, label, result=""):
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {label} {result}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def flops(B, H, N, dk, dv, mode):
    fwd = 2.0 * B * H * N * N * (dk + dv)
    return fwd if mode == "fwd" else 3.5 * fwd


def block_shape(block, shape):
    """(B, H, N, area) of a --shapes entry: area 1 unless the block is aattn and it says."""
    B, H, N = shape[:3]
    return B, H, N, shape[3] if block == "aattn" and len(shape) == 4 else 1


def block_views(case, src, mode, H):
    """(q, k, v) a row starts from: of a leaf copy of src for fwd+bwd."""
    src = src if mode == "fwd" else layouts.leaf(src)
    return layouts.views(case.block, src, H, case.dk, case.dv)


def failed_row(e):
    return empty_row(status="OOM" if is_oom(e) else "n/a", note=short_error(e))


def plan_key(name, mode, dtype_name, dims, block):
    return (name, mode, dtype_name) + tuple(dims) + (block,)


def work(B, H, N, area=1):
    # B*H*N^2 of the attention calls: an area is a call of its own.
    return plan.work(*layouts.attn_dims(B, H, N, area))


def probe(name, mode, dtype_name, case, cfg):
    """Runs one peer at PROBE_SHAPE, so that the planner can scale a larger row from it."""
    B, H, N = PROBE_SHAPE
    src, dout = layouts.make_inputs(case, B, H, N, cfg.seed)
    try:
        row, _ = run_peer(name, case, mode, *block_views(case, src, mode, H), dout, cfg)
    except Exception:  # noqa: BLE001 - no probe, no prediction: the row itself will say why
        row = None
    finally:
        del src, dout
        free(case.device)
    if row and row["status"] == "ok":
        record(cfg, plan_key(name, mode, dtype_name, (case.dk, case.dv), case.block),
               work(B, H, N, case.area), row, f"probe {B}x{H}x{N}")


def record(cfg, key, w, row, label):
    peak = None if row["peak_mb"] is None else row["peak_mb"] * 2**20
    cfg.planner.record(key, w, row["kernel_us"] * 1e-6, peak, label)


def case_reference(label, case, B, H, N, src, dout, cfg):
    """The float64 reference of this case in its peers' layout, or (None, why not)."""
    grads = "fwd+bwd" in cfg.modes
    q, k, v, d = layouts.to_reference(case.block, case.area,
                                      *layouts.views(case.block, layouts.detached(src), H,
                                                     case.dk, case.dv), dout)
    d = d if grads else None
    ref = cfg.references.get(q, k, v, case.scale, d)
    if ref is not None:
        cfg.reference_s[label] = "reused"
        return layouts.from_reference(case.block, case.area, ref), ""
    key, w = ("reference", grads, case.dk, case.dv), work(B, H, N, case.area)
    pred = cfg.planner.predict(key, w)
    left = cfg.planner.left()
    if pred is not None and left is not None and pred.seconds > left:
        return None, (f"no reference: predicted {pred.seconds:.0f} s (from {pred.basis}), "
                      f"{max(left, 0):.0f} s left of the budget")
    t0 = time.perf_counter()
    # In host memory, where the rows' outputs wait (measure.run_peer): a GPU keeps all of
    # its memory for the rows.
    ref = tuple(None if x is None else x.cpu() for x in reference(q, k, v, case.scale, d))
    cost = time.perf_counter() - t0
    cfg.planner.record(key, w, cost, None, f"{B}x{H}x{N}")
    cfg.references.put(q, k, v, case.scale, d, ref)
    cfg.reference_s[label] = round(cost, 2)
    return layouts.from_reference(case.block, case.area, ref), ""


def run_row(name, mode, dtype_name, shape, case, views, dout, cfg):
    """(row, outputs): a measured row, or one that says why it was skipped."""
    B, H, N = shape
    t0 = time.perf_counter()
    key = plan_key(name, mode, dtype_name, (case.dk, case.dv), case.block)
    w = work(B, H, N, case.area)
    if cfg.probes and not cfg.planner.known(key) and w > plan.work(*PROBE_SHAPE):
        probe(name, mode, dtype_name, case, cfg)
    pred = cfg.planner.predict(key, w)
    refused = cfg.planner.refuse(pred, pred and row_seconds(pred.seconds, cfg))
    if refused:
        res, outs = empty_row(status=refused[0], note=refused[1]), None
    else:
        try:   # run_peer guards itself; this only keeps a bug in it from ending the run
            res, outs = run_peer(name, case, mode, *views, dout, cfg,
                                 long_call=pred is not None and pred.seconds > LONG_CALL_S)
        except Exception as e:  # noqa: BLE001
            res, outs = failed_row(e), None
            free(case.device)
        if res["status"] == "ok":
            record(cfg, key, w, res, f"{B}x{H}x{N}")
    res["predicted_s"] = pred and pred.seconds
    res["predicted_row_s"] = pred and row_seconds(pred.seconds, cfg)
    res["predicted_peak_mb"] = pred and pred.peak_bytes and pred.peak_bytes / 2**20
    res["cost_s"] = time.perf_counter() - t0   # every call of the row, its probe included
    return res, outs


def run_case(block, dtype_name, shape, dims, cfg, rows, steps, progress):
    B, H, N, area = block_shape(block, shape)
    dk, dv = dims
    dtype, _ = DTYPES[dtype_name]
    device = cfg.device
    case = peers.Case(dk=dk, dv=dv, scale=dk ** -0.5, dtype=dtype, device=device, block=block,
                      area=area)
    base = dict(block=block, B=B, H=H, N=N, area=area, dk=dk, dv=dv, dtype=dtype_name)
    label = report.shape_label(base)
    # The eager training-step table is the PSA block's (measure.eager_step_row).
    step = cfg.step and block == "psa"
    try:
        src, dout = layouts.make_inputs(case, B, H, N, cfg.seed)
        failed = None
    except Exception as e:  # noqa: BLE001 - e.g. OOM at a huge N: mark the case, go on
        failed = failed_row(e)
        failed["note"] = "case setup: " + failed["note"]
    if failed:
        free(device)
        for mode in cfg.modes:
            for name in cfg.peers:
                rows.append(dict(base, mode=mode, peer=name, **failed))
                progress.step(f"{dtype_name} {label} {mode} {name}", failed["status"])
        if step:
            progress.step(f"{dtype_name} {label} eager step", failed["status"])
        return
    views = {mode: block_views(case, src, mode, H) for mode in cfg.modes}
    # Peer by peer, both modes each: ours first, so that a budget that runs out in a large
    # case cuts peers, not our own rows.
    done, outputs = {}, {}
    for name in cfg.peers:
        for mode in cfg.modes:
            res, outs = run_row(name, mode, dtype_name, (B, H, N), case, views[mode], dout, cfg)
            r = dict(base, mode=mode, peer=name, **res)
            if r["kernel_us"]:
                r["tflops"] = (flops(*layouts.attn_dims(B, H, N, area), dk, dv, mode)
                               / (r["kernel_us"] * 1e-6) / 1e12)
            done[(mode, name)] = r
            if outs is not None:
                outputs[(mode, name)] = outs
            progress.step(f"{dtype_name} {label} {mode} {name}",
                          f"{r['kernel_us']:.1f} us" if r["kernel_us"] else f"{r['status']} {r['note']}")
    del views
    # The reference last: a budget spent on rows leaves the error columns empty, not the times.
    if outputs:
        ref, why = case_reference(report.reference_label(base), case, B, H, N, src, dout, cfg)
        for key, outs in outputs.items():
            if ref is not None:
                add_errors(done[key], outs, ref)
            else:
                done[key]["note"] = "; ".join(filter(None, [done[key]["note"], why]))
        del ref
    outputs.clear()
    for mode in cfg.modes:
        mode_rows = [done[(mode, name)] for name in cfg.peers]
        ours = next((r for r in mode_rows if r["peer"] == "ours" and r["status"] == "ok"), None)
        for r in mode_rows:
            if ours and r["kernel_us"]:
                r["vs_ours"] = r["kernel_us"] / ours["kernel_us"]
        rows += mode_rows
    if step:
        steps.append(dict(base, **eager_step_row(case, src, H, dout, cfg)))
        progress.step(f"{dtype_name} {label} eager step")
    del src, dout
    free(device)


def configure(args):
    cuda = torch.cuda.is_available() if args.device is None else args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    column = 2 if not cuda else 1 if args.quick else 0
    shapes = {b: args.shapes or BLOCK_DEFAULTS[b][column] for b in args.blocks}
    dims = {b: args.head_dims or [BLOCK_DEFAULTS[b][3]] for b in args.blocks}
    if cuda:
        dtypes = args.dtypes or (["bf16"] if args.quick else list(DTYPES))
        peer_names = args.peers or peers.GPU_DEFAULT
        repeats, target_ms = (3, 5.0) if args.quick else (7, 20.0)
    else:
        dtypes = args.dtypes or ["fp32", "bf16"]
        peer_names = args.peers or peers.CPU_DEFAULT
        # Five loops, not three: drift on a shared 2-core machine can slow two loops in a row.
        repeats, target_ms = (3, 10.0) if args.quick else (5, 20.0)
    budget_s = args.budget_s
    if budget_s is None:
        budget_s = (150 if args.quick else None) if cuda else CPU_BUDGET_S
    cfg = argparse.Namespace(
        device=device, blocks=args.blocks, shapes=shapes, dtypes=dtypes, peers=peer_names,
        dims=dims,
        modes=args.modes, step=cuda if args.step is None else args.step, seed=args.seed,
        warmup=3 if cuda else 2, repeats=args.repeats or repeats,
        target_s=(args.target_ms or target_ms) / 1e3,
        budget_s=None if budget_s is None or math.isinf(budget_s) else budget_s,
        # Host memory is what a CPU row can run out of, and what it is killed for; on a GPU an
        # allocation that fails is an exception, and the row says OOM.
        probes=not cuda, references=Cache(), reference_s={})
    row_cap_s = args.row_cap_s if args.row_cap_s is not None else (None if cuda else CPU_ROW_CAP_S)
    cfg.row_cap_s = None if row_cap_s is None or math.isinf(row_cap_s) else row_cap_s
    cfg.planner = plan.Planner(cfg.budget_s, memory_guard=not cuda, row_cap_s=cfg.row_cap_s)
    if args.out:
        out = args.out
    else:
        where = torch.cuda.get_device_name(device) if cuda else "cpu"
        slug = "".join(c if c.isalnum() else "-" for c in where.lower()).strip("-")
        out = os.path.join(HERE, "results", "local", time.strftime("%Y%m%d-%H%M%S") + "-" + slug)
    cfg.out = os.path.splitext(out)[0] if out.endswith((".json", ".md")) else out
    return cfg


def config_doc(cfg):
    if cfg.device.type == "cuda":
        graphed = ", ".join(sorted(f"{p} {m}" for p, m in peers.GRAPH_SAFE))
        method = (f"the timing column says how, per row. 'CUDA graph xN': forward calls under "
                  f"{timing.GRAPH_BELOW_S * 1e3:g} ms of peers known to capture cleanly ({graphed}), "
                  f"captured {timing.GRAPH_CALLS} to a CUDA graph replayed between CUDA events: "
                  "GPU time only, host launch cost excluded, idle gaps between the graph's kernels "
                  f"included; median of {cfg.repeats} repeats. 'profiler kernel sum xK': every "
                  "other row, all fwd+bwd rows included: K eager calls under torch.profiler (CUDA "
                  "activity), the durations of all device kernels, memcpys and memsets summed and "
                  "divided by K: the device work of the call, the peer's own layout copies "
                  "included, host time and idle gaps between kernels excluded (so a little below "
                  "what a graph replay of the same work would show, which favours these rows over "
                  "graph-timed ones of the same mode); median of up to "
                  f"{min(timing.PROFILE_SESSIONS, cfg.repeats)} sessions. 'events xN': only where "
                  "the profiler failed (the note says why): CUDA events around a loop of eager "
                  "calls, GPU time only while the GPU is the bottleneck; 'launch-bound?' marks "
                  "rows whose host enqueue time was over 0.8x the GPU time, an upper bound")
    else:
        method = (f"host perf_counter around a loop of calls (CPU: one clock, so no separate "
                  f"wall column), median of {cfg.repeats} loops of at least "
                  f"{cfg.target_s * 1e3:g} ms each; calls of half a second or more: "
                  f"{max(2, cfg.repeats // 3)} single calls; calls over {LONG_CALL_S:g} s: one "
                  "timed call; where the planner predicted that (the same peer ran at a smaller "
                  "shape before), the row's one call, which is both its memory call and its "
                  "timed call, with no warm-up")
    memory = (rss.method() if not rss.unavailable() else f"peak RSS not measured: {rss.unavailable()}"
              ) if cfg.device.type == "cpu" else ("max_memory_allocated during one call minus what "
                                                  "was allocated before it (inputs)")
    return dict(device=str(cfg.device), blocks=cfg.blocks, shapes=cfg.shapes, dtypes=cfg.dtypes,
                peers=cfg.peers,
                head_dims=cfg.dims, modes=cfg.modes, repeats=cfg.repeats, warmup=cfg.warmup,
                target_ms=cfg.target_s * 1e3, seed=cfg.seed, kernel_method=method,
                peak_memory_method=memory + "; measured on a call of its own, before the timed ones",
                budget_s=cfg.budget_s,
                planning=("rows are predicted from the largest earlier row of the same peer, mode "
                          "and dtype (plan.py), scaled by B*H*N^2"
                          + (f"; a row without one from a probe at {'x'.join(map(str, PROBE_SHAPE))}"
                             if cfg.probes else "")
                          + (f"; a row whose predicted peak exceeds {plan.MEMORY_SHARE:g} x "
                             "MemAvailable is skipped" if cfg.planner.memory_guard else "")
                          + ("; with a budget, so is a row whose predicted calls would end after "
                             "it" if cfg.budget_s else "")
                          + (f"; so is a row predicted to take over {cfg.row_cap_s:g} s"
                             if cfg.row_cap_s else "")),
                float32_matmul_precision={k: v[1] for k, v in DTYPES.items() if k in cfg.dtypes},
                reference="float64 eager math of the same inputs (each area a batch entry of its "
                          "own; bf16-exact values for 16-bit "
                          "rows and for every CPU row, so those of a shape share one reference; "
                          "full fp32 values for GPU fp32 rows), over blocks of query rows (every "
                          "row, every key), computed after the case's rows",
                reference_s=cfg.reference_s, stopped_early=None)


def main(argv=None):
    args = parse_args(argv)
    cfg = configure(args)
    meta, doc_cfg = report.machine(cfg.device), config_doc(cfg)
    rows, steps = [], []
    cases = [(b, d, s, hd) for b in cfg.blocks for d in cfg.dtypes for s in cfg.shapes[b]
             for hd in cfg.dims[b]]
    progress = Progress(len(cases) * len(cfg.modes) * len(cfg.peers)
                        + cfg.step * sum(b == "psa" for b, *_ in cases))
    t0 = cfg.planner.t0
    precision = torch.get_float32_matmul_precision()
    print(f"psa_fa2_ext benchmark on {meta.get('gpu') or meta.get('cpu')}: {len(cases)} cases "
          f"x {len(cfg.peers)} peers x {len(cfg.modes)} modes -> {cfg.out}.md", file=sys.stderr)
    try:
        for i, (block, dtype_name, shape, dims) in enumerate(cases):
            if cfg.budget_s and time.perf_counter() - t0 > cfg.budget_s:
                left = [f"{b} {d} {s}" for b, d, s, _ in cases[i:]]
                doc_cfg["stopped_early"] = f"--budget-s {cfg.budget_s:g} reached; not run: {', '.join(left)}"
                break
            want = DTYPES[dtype_name][1]
            if torch.get_float32_matmul_precision() != want:
                torch.set_float32_matmul_precision(want)
                # Compiled peers must not reuse kernels built under the other precision.
                torch._dynamo.reset()
            run_case(block, dtype_name, shape, dims, cfg, rows, steps, progress)
            report.write(cfg.out, meta, doc_cfg, rows, steps)   # partial results survive a kill
    finally:
        torch.set_float32_matmul_precision(precision)
        progress.close()
    doc_cfg["elapsed_s"] = round(time.perf_counter() - t0, 1)
    md = report.write(cfg.out, meta, doc_cfg, rows, steps)
    print(md)
    print(f"wrote {cfg.out}.json and {cfg.out}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
