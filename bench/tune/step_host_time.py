"""Host time per call of each piece of the eager training step at the shipped YOLO shape
(B, H, N = 16, 4, 400, bf16), in interleaved rounds (the host's speed drifts over seconds):

    python bench/tune/step_host_time.py [--rounds 3] [--pieces step sdpa ...] [--single-thread]

Each piece runs in a loop synchronised at its end, so a time is what the host pays per call
(or the GPU's time, where that is longer: the bwd op alone is GPU-bound). `--single-thread`
adds the autograd pieces again under torch.autograd.set_multithreading_enabled(False), which
runs the backward on the calling thread instead of handing it to the engine's CUDA thread:
the difference is what that hand-over costs every backward, ours and SDPA's alike.
"""
import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
import psa_fa2_ext  # noqa: E402
from measure import split_views  # noqa: E402
from timing import host_time  # noqa: E402

B, H, dk, dv, N = 16, 4, 32, 64, 400
SCALE = dk ** -0.5
CALLS = 1000
PIECES = ("step", "step_op", "sdpa", "trivial", "bwd_only", "fwd_graph", "fwd_op", "bwd_op")


def views(t):
    return split_views(t, H, dk, dv)   # the block's own line, as the benchmark runs it


def make_pieces():
    x = torch.randn(B, H * (2 * dk + dv), 20, 20, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    g = torch.randn(B, H, dv, N, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(64, device="cuda", requires_grad=True)
    g_small = torch.randn(64, device="cuda")
    kept = psa_fa2_ext.psa_attention(*views(x), SCALE)   # a graph to run backward through again
    xd = x.detach()
    q, k, v = (t.transpose(2, 3) for t in views(xd))
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, SCALE, "auto")
    d_base = torch.empty_like(xd)
    dq, dk_, dv_ = (t.transpose(2, 3) for t in views(d_base))
    dout = g.transpose(2, 3)

    def step():   # the benchmark's step row for ours
        psa_fa2_ext.psa_attention(*views(x), SCALE).backward(g)
        x.grad = None

    def step_op():   # the same without the Python wrapper
        torch.ops.psa_fa2.psa_attention.default(*views(x), SCALE, "auto").backward(g)
        x.grad = None

    def sdpa():   # SDPA on contiguous copies of the views
        qc, kc, vc = (t.transpose(-2, -1).contiguous() for t in views(x))
        o = torch.nn.functional.scaled_dot_product_attention(qc, kc, vc)
        o.transpose(-2, -1).contiguous().backward(g)
        x.grad = None

    def trivial():   # the engine's cost with one tiny op in the graph
        small.mul(2.0).backward(g_small)
        small.grad = None

    def bwd_only():
        kept.backward(g, retain_graph=True)
        x.grad = None

    def fwd_graph():
        psa_fa2_ext.psa_attention(*views(x), SCALE)

    def fwd_op():
        torch.ops.psa_fa2.fwd.default(q, k, v, SCALE, "auto")

    def bwd_op():
        torch.ops.psa_fa2.bwd.default(dout, q, k, v, out, lse, SCALE, dq, dk_, dv_, "auto",
                                      False, False)

    pieces = dict(step=step, step_op=step_op, sdpa=sdpa, trivial=trivial, bwd_only=bwd_only,
                  fwd_graph=fwd_graph, fwd_op=fwd_op, bwd_op=bwd_op)
    assert tuple(pieces) == PIECES
    return pieces


AUTOGRAD_PIECES = ("step", "sdpa", "trivial", "bwd_only")


def loop_us(fn):
    for _ in range(10):
        fn()
    return host_time(fn, torch.device("cuda"), CALLS) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pieces", nargs="+", choices=PIECES, default=list(PIECES))
    ap.add_argument("--single-thread", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_host_time.py times the CUDA step: no CUDA GPU is visible")
    pieces = make_pieces()
    times = {name: [] for name in args.pieces}
    single = [name for name in AUTOGRAD_PIECES if name in args.pieces] if args.single_thread else []
    times.update({name + " (one thread)": [] for name in single})
    for _ in range(args.rounds):
        for name in args.pieces:
            times[name].append(loop_us(pieces[name]))
        with torch.autograd.set_multithreading_enabled(False):
            for name in single:
                times[name + " (one thread)"].append(loop_us(pieces[name]))
    print("| piece | median us | rounds |\n|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.1f} | " + " ".join(f"{t:.0f}" for t in ts) + " |")


if __name__ == "__main__":
    main()
