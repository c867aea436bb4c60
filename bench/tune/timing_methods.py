"""One forward timed by each of the benchmark's clocks, bf16 and fp16 taking turns:

    python bench/tune/timing_methods.py [--shape 1x2x62500] [--peers ours fa4] [--rounds 4]

bench_attention.py times short forward calls of the peers that capture cleanly (ours among
them) as CUDA-graph replays, and every other row, FlashAttention-4's always, as profiler kernel
sums (bench/timing.py says why). This times each peer's forward on the block's split views by
every clock that can run it, over the same number of calls: a graph replay and a graph of one
call replayed (graph-safe peers only), the profiler's kernel sum, and CUDA events around an
eager loop, each round starting at another of them. They should agree for calls of
milliseconds; where one does not, the benchmark's ratios carry that clock's bias. Per row:
round, dtype, peer, clock, us per call, and the SM clock after it.
"""
import argparse
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import measure  # noqa: E402
import peers  # noqa: E402
import timing  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DK, DV = 32, 64


def sm_clock():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1x2x62500", metavar="BxHxN")
    ap.add_argument("--peers", nargs="+", default=["ours", "fa4"], choices=list(peers.PEERS))
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--target-ms", type=float, default=100.0, help="work per clock reading")
    args = ap.parse_args()
    B, H, N = (int(x) for x in args.shape.split("x"))
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, B,H,N = {B},{H},{N}, ({DK}, {DV}), forward")
    print("| round | dtype | peer | clock | us per call | SM clock after |")
    print("|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for name in args.dtypes:
            dtype = DTYPES[name]
            torch.manual_seed(rnd)
            qkv = torch.randn(B, H * (2 * DK + DV), N, 1, device=device, dtype=dtype)
            q, k, v = measure.split_views(qkv, H, DK, DV)
            case = peers.Case(DK, DV, DK ** -0.5, dtype, device)
            for peer in args.peers:
                try:
                    cand = peers.build(peer, case)[0]
                except peers.Unsupported as e:
                    print(f"| {rnd} | {name} | {peer} | - | unsupported: {e} | |")
                    continue
                with cand.context():
                    def fn():
                        return cand.fn(q, k, v)
                    for _ in range(3):
                        fn()
                    timing.sync(device)
                    est, _ = timing._events(fn, 3)
                    n = max(1, math.ceil(args.target_ms * 1e-3 / (est / 3)))
                    clocks = [("events", lambda: timing._events(fn, n)[0] / n),
                              ("profiler", lambda: timing._profiled_times(fn, device, n, 1)[0])]
                    if (peer, "fwd") in peers.GRAPH_SAFE:
                        clocks.append(("graph", lambda: timing._graph_times(fn, device, n, 1)[0]))
                        # One captured call keeps one set of buffer addresses, as the eager
                        # loop does; a graph of many calls has a set per captured call.
                        clocks.append(("graph of 1 call",
                                       lambda: timing._graph_times(fn, device, n, 1, calls=1)[0]))
                    # Each round starts at another clock: the GPU's own clock drifts as it
                    # warms, and a fixed order would charge that to the clock read last.
                    shift = rnd % len(clocks)
                    for clock, read in clocks[shift:] + clocks[:shift]:
                        us = read() * 1e6
                        print(f"| {rnd} | {name} | {peer} | {clock} x{n} | {us:.0f} | "
                              f"{sm_clock()} |", flush=True)


if __name__ == "__main__":
    main()
