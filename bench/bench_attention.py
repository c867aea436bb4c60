#!/usr/bin/env python
"""Benchmark psa_fa2_ext against every attention a PSA / C2PSA user could pick.

    python bench/bench_attention.py                 # CPU: small default; GPU: full matrix
    python bench/bench_attention.py --quick         # GPU: bf16, four shapes, ~2 min
    python bench/bench_attention.py --shapes 8x4x6400 --dtypes bf16 --peers ours sdpa_cudnn

Writes <out>.json and <out>.md and prints the markdown, its summary table last. Results
are rewritten after every case, so a run that is killed keeps what it finished.

The full GPU matrix (4 dtypes x 7 shapes x 9 peers x 2 modes, with torch.compile and
JIT peers) does not reliably fit one 10-minute command. Run it one dtype per command,
each stopping before its limit, then merge:

    for d in bf16 fp16 fp32 fp32-tf32; do
      python bench/bench_attention.py --dtypes $d --budget-s 420 --out bench/results/full-$d
    done
    python bench/report.py bench/results/full-*.json --out bench/results/full

--budget-s only stops new cases from starting (the report lists those not run; rerun
them with --shapes). --quick on GPU defaults to --budget-s 150 for the same reason.
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

import peers  # noqa: E402
from measure import (eager_step_row, empty_row, free, is_oom, run_peer,  # noqa: E402
                     short_error, split_views)
import report  # noqa: E402
import timing  # noqa: E402
from reference import reference  # noqa: E402

GPU_SHAPES = [(16, 2, 400), (16, 4, 400), (64, 4, 400), (1, 4, 400), (16, 4, 1600),
              (8, 4, 6400), (1, 2, 62500)]
QUICK_SHAPES = [(16, 4, 400), (64, 4, 400), (16, 4, 1600), (8, 4, 6400)]
CPU_SHAPES = [(2, 2, 400)]
# name -> (dtype, float32 matmul precision). "high" lets fp32 matmuls use TF32.
DTYPES = {"bf16": (torch.bfloat16, "highest"), "fp16": (torch.float16, "highest"),
          "fp32": (torch.float32, "highest"), "fp32-tf32": (torch.float32, "high")}
MODES = ("fwd", "fwd+bwd")


def parse_triple(s):
    parts = s.replace("x", ",").split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"shape must be BxHxN, got {s!r}")
    return tuple(int(p) for p in parts)


def parse_pair(s):
    parts = s.replace("x", ",").split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"head dims must be DKxDV, got {s!r}")
    return tuple(int(p) for p in parts)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    p.add_argument("--shapes", nargs="+", type=parse_triple, metavar="BxHxN")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES))
    p.add_argument("--peers", nargs="+", choices=list(peers.PEERS))
    p.add_argument("--head-dims", nargs="+", type=parse_pair, default=[(32, 64)], metavar="DKxDV")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--no-step", action="store_true", help="skip the eager training-step table")
    p.add_argument("--quick", action="store_true",
                   help="short timing; on GPU bf16 and four shapes unless --dtypes/--shapes say")
    p.add_argument("--repeats", type=int, help="timed repeats per row (median reported)")
    p.add_argument("--target-ms", type=float, help="work per timed repeat")
    p.add_argument("--budget-s", type=float,
                   help="start no new case after this many seconds (results so far are kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="path prefix for .json/.md; default bench/results/<date>-<device>")
    return p.parse_args(argv)


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


def grid(N):
    # A feature map h x w with h*w == N, as close to square as N allows.
    h = int(math.isqrt(N))
    while N % h:
        h -= 1
    return h, N // h


def flops(B, H, N, dk, dv, mode):
    fwd = 2.0 * B * H * N * N * (dk + dv)
    return fwd if mode == "fwd" else 3.5 * fwd


def make_inputs(case, B, H, N, seed, grads):
    """qkv [B, H*(2dk+dv), h, w], dout [B, H, dv, N] and the float64 reference."""
    # A CPU generator: the same numbers on every device, and no use of the CUDA generator,
    # whose state a peer's failed graph capture could have broken.
    gen = torch.Generator().manual_seed(seed)
    h, w = grid(N)
    qkv = torch.randn(B, H * (2 * case.dk + case.dv), h, w, generator=gen)
    dout = torch.randn(B, H, case.dv, N, generator=gen)
    qkv, dout = qkv.to(case.device, case.dtype), dout.to(case.device, case.dtype)
    q, k, v = split_views(qkv, H, case.dk, case.dv)
    return qkv, dout, reference(q, k, v, case.scale, dout if grads else None)


def failed_row(e):
    return empty_row(status="OOM" if is_oom(e) else "n/a", note=short_error(e))


def run_case(dtype_name, shape, dims, cfg, rows, steps, progress):
    B, H, N = shape
    dk, dv = dims
    dtype, _ = DTYPES[dtype_name]
    device = cfg.device
    case = peers.Case(dk=dk, dv=dv, scale=dk ** -0.5, dtype=dtype, device=device)
    base = dict(B=B, H=H, N=N, dk=dk, dv=dv, dtype=dtype_name)
    try:
        qkv, dout, ref = make_inputs(case, B, H, N, cfg.seed, "fwd+bwd" in cfg.modes)
        failed = None
    except Exception as e:  # noqa: BLE001 - e.g. OOM at a huge N: mark the case, go on
        failed = failed_row(e)
        failed["note"] = "case setup: " + failed["note"]
    if failed:
        free(device)
        for mode in cfg.modes:
            for name in cfg.peers:
                rows.append(dict(base, mode=mode, peer=name, **failed))
                progress.step(f"{dtype_name} {B}x{H}x{N} {mode} {name}", failed["status"])
        if cfg.step:
            progress.step(f"{dtype_name} {B}x{H}x{N} eager step", failed["status"])
        return
    q, k, v = split_views(qkv, H, dk, dv)
    for mode in cfg.modes:
        if mode == "fwd":
            views = (q, k, v)
        else:
            views = split_views(qkv.detach().requires_grad_(True), H, dk, dv)
        mode_rows = []
        for name in cfg.peers:
            label = f"{dtype_name} {B}x{H}x{N} {mode} {name}"
            try:   # run_peer guards itself; this only keeps a bug in it from ending the run
                res = run_peer(name, case, mode, *views, dout, ref, cfg)
            except Exception as e:  # noqa: BLE001
                res = failed_row(e)
                free(device)
            r = dict(base, mode=mode, peer=name, **res)
            if r["kernel_us"]:
                r["tflops"] = flops(B, H, N, dk, dv, mode) / (r["kernel_us"] * 1e-6) / 1e12
            mode_rows.append(r)
            progress.step(label, f"{r['kernel_us']:.1f} us" if r["kernel_us"] else
                          f"{r['status']} {r['note']}")
        ours = next((r for r in mode_rows if r["peer"] == "ours" and r["status"] == "ok"), None)
        for r in mode_rows:
            if ours and r["kernel_us"]:
                r["vs_ours"] = r["kernel_us"] / ours["kernel_us"]
        rows += mode_rows
        del views
    del ref
    if cfg.step:
        steps.append(dict(base, **eager_step_row(case, qkv, H, dout, cfg)))
        progress.step(f"{dtype_name} {B}x{H}x{N} eager step")
    del qkv, dout, q, k, v
    free(device)


def configure(args):
    cuda = torch.cuda.is_available() if args.device is None else args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        shapes = args.shapes or (QUICK_SHAPES if args.quick else GPU_SHAPES)
        dtypes = args.dtypes or (["bf16"] if args.quick else list(DTYPES))
        peer_names = args.peers or peers.GPU_DEFAULT
        repeats, target_ms = (3, 5.0) if args.quick else (7, 20.0)
    else:
        # No GPU: a small case that finishes well under a minute, so the script runs anywhere.
        shapes = args.shapes or CPU_SHAPES
        dtypes = args.dtypes or ["fp32", "bf16"]
        peer_names = args.peers or peers.CPU_DEFAULT
        repeats, target_ms = (3, 10.0) if args.quick else (3, 20.0)
    cfg = argparse.Namespace(
        device=device, shapes=shapes, dtypes=dtypes, peers=peer_names, dims=args.head_dims,
        modes=args.modes, step=not args.no_step, seed=args.seed, warmup=3 if cuda else 2,
        repeats=args.repeats or repeats, target_s=(args.target_ms or target_ms) / 1e3,
        budget_s=args.budget_s if args.budget_s is not None else (150 if cuda and args.quick else None))
    if args.out:
        out = args.out
    else:
        where = torch.cuda.get_device_name(device) if cuda else "cpu"
        slug = "".join(c if c.isalnum() else "-" for c in where.lower()).strip("-")
        out = os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S") + "-" + slug)
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
        method = (f"host perf_counter around a loop (CPU, no GPU), median of {cfg.repeats} "
                  "repeats")
    return dict(device=str(cfg.device), shapes=cfg.shapes, dtypes=cfg.dtypes, peers=cfg.peers,
                head_dims=cfg.dims, modes=cfg.modes, repeats=cfg.repeats, warmup=cfg.warmup,
                target_ms=cfg.target_s * 1e3, seed=cfg.seed, kernel_method=method,
                float32_matmul_precision={k: v[1] for k, v in DTYPES.items() if k in cfg.dtypes},
                reference="float64 eager math of the same inputs, over blocks of query rows "
                          "(every row, every key)",
                stopped_early=None)


def main(argv=None):
    args = parse_args(argv)
    cfg = configure(args)
    meta, doc_cfg = report.machine(cfg.device), config_doc(cfg)
    rows, steps = [], []
    cases = [(d, s, hd) for d in cfg.dtypes for s in cfg.shapes for hd in cfg.dims]
    progress = Progress(len(cases) * (len(cfg.modes) * len(cfg.peers) + cfg.step))
    t0 = time.perf_counter()
    precision = torch.get_float32_matmul_precision()
    print(f"psa_fa2_ext benchmark on {meta.get('gpu') or meta.get('cpu')}: {len(cases)} cases "
          f"x {len(cfg.peers)} peers x {len(cfg.modes)} modes -> {cfg.out}.md", file=sys.stderr)
    try:
        for i, (dtype_name, shape, dims) in enumerate(cases):
            if cfg.budget_s and time.perf_counter() - t0 > cfg.budget_s:
                left = [f"{d} {s}" for d, s, _ in cases[i:]]
                doc_cfg["stopped_early"] = f"--budget-s {cfg.budget_s:g} reached; not run: {', '.join(left)}"
                break
            want = DTYPES[dtype_name][1]
            if torch.get_float32_matmul_precision() != want:
                torch.set_float32_matmul_precision(want)
                # Compiled peers must not reuse kernels built under the other precision.
                torch._dynamo.reset()
            run_case(dtype_name, shape, dims, cfg, rows, steps, progress)
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
