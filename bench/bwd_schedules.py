"""The backward schedules side by side: kernel time of torch.ops.psa_fa2.bwd with
deterministic=False (schedule (a): K/V-tile CTAs, dQ by fp32 atomics) and deterministic=True
(schedule (b): row-tile CTAs, no atomics), on the benchmark's shapes, channel-first (32, 64)
or (with --dv 32) YOLO12's (32, 32).
On Hopper, where schedule (a) runs on the wgmma kernel by default, the (a) and (b) columns are
the mma.sync kernels (psa_fa2_ext._testing.force(no_sm90=True)) and a last column pair adds
the wgmma (a), with the largest relative difference of its gradients from the mma.sync
kernel's.

    python bench/bwd_schedules.py [--dtypes bf16 fp16] [--shapes 16x4x400 ...] [--dv 64|32]

Each figure is the median over repeats of one CUDA-graph replay of `CALLS` back-to-back
calls between CUDA events, divided by `CALLS`: device time only, no launch gaps. Prints a
markdown table.
"""
import argparse
import statistics

import torch

import psa_fa2_ext  # noqa: F401  (registers torch.ops.psa_fa2)
from psa_fa2_ext import _plan, _testing

SHAPES = [(16, 2, 400), (16, 4, 400), (64, 4, 400), (1, 4, 400), (16, 4, 1600), (8, 4, 6400),
          (1, 2, 62500)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CALLS = 20
REPEATS = 7


def parse_shape(text):
    B, H, N = (int(x) for x in text.lower().split("x"))
    return B, H, N


def bwd_inputs(B, H, N, dtype, dk=32, dv=64):
    x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=dtype)
    q, k, v = (t.transpose(2, 3) for t in x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, dk ** -0.5, "fast")
    dout = torch.randn(B, H, dv, N, device="cuda", dtype=dtype).transpose(2, 3)
    grads = torch.zeros_like(x)
    dq, dk_, dv_ = (t.transpose(2, 3) for t in grads.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
    return (dout, q, k, v, out, lse, dk ** -0.5, dq, dk_, dv_)


def graph_time_us(fn):
    """Median device time of one fn() call, from graph replays of CALLS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPEATS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16"])
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES, metavar="BxHxN")
    p.add_argument("--dv", type=int, choices=[64, 32], default=64, help="dk is 32")
    args = p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, (32, {args.dv})\n")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if hopper and not runs_wgmma(32, args.dv):
        raise SystemExit(f"this build has no wgmma backward at (32, {args.dv}) for this GPU")
    if hopper:
        print("| dtype | B×H×N | (a) atomic dQ us | (b) combined us | (b)/(a) "
              "| (a) wgmma us | (a)/(a) wgmma | wgmma rel. diff |")
        print("|---|---|---|---|---|---|---|---|")
    else:
        print("| dtype | B×H×N | (a) atomic dQ us | (b) combined us | (b)/(a) |")
        print("|---|---|---|---|---|")
    for name in args.dtypes:
        for B, H, N in args.shapes:
            a = bwd_inputs(B, H, N, DTYPES[name], dv=args.dv)
            with mma_sync_kernels():
                t_a = graph_time_us(lambda: torch.ops.psa_fa2.bwd(*a, "fast", False))
                t_b = graph_time_us(lambda: torch.ops.psa_fa2.bwd(*a, "fast", True))
                reference = gradients(a)
            row = f"| {name} | {B}×{H}×{N} | {t_a:.1f} | {t_b:.1f} | {t_b / t_a:.2f} |"
            if hopper:
                t_w = graph_time_us(lambda: torch.ops.psa_fa2.bwd(*a, "fast", False))
                diff = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                           for x, y in zip(gradients(a), reference))
                row += f" {t_w:.1f} | {t_a / t_w:.2f} | {diff:.1e} |"
            print(row, flush=True)
            del a
            torch.cuda.empty_cache()


def gradients(args):
    """dq, dk, dv of one fresh (accumulate=False) backward of args."""
    dq, dk, dv = (torch.empty_like(t) for t in args[7:])
    torch.ops.psa_fa2.bwd(*args[:7], dq, dk, dv, "fast", False, False)
    return dq, dk, dv


def runs_wgmma(dk, dv, direction="bwd"):
    """Whether the plan runs the wgmma kernel at (dk, dv) on the visible GPU with this build
    (else a "wgmma" column would time the mma.sync kernel twice)."""
    q, k, v = _plan.inputs(16, 4, 400, dk, dv, torch.bfloat16, "psa")
    return _plan.plan(direction, q, k, v, device=_plan.current_device())[0].startswith("wgmma")


def mma_sync_kernels():
    """The mma.sync kernels that Ampere runs, on Hopper too, for the calls inside the block
    (kernels are planned per call, so a graph captured inside keeps them)."""
    return _testing.force(no_sm90=True)


if __name__ == "__main__":
    main()
