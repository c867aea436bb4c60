"""Host time of the fused CPU kernels with each copy of their tile math ("avx512" and "avx2"
where the CPU has them, and "baseline": SSE2 on x86-64, NEON on aarch64), forward and forward + backward, on
the block's channel-first views, fp32. Compare two builds by running it from each build's
tree in turn (PYTHONPATH=<tree>), rounds alternating.

    python bench/tune/cpu_tile_math.py --shapes 1x4x1600:32x64 4x2x1600:32x32 16x8x400:32x32
"""
import argparse
import time

import torch

import psa_fa2_ext
from psa_fa2_ext import _testing


def parse_shape(text):
    bhn, _, dims = text.partition(":")
    b, h, n = (int(x) for x in bhn.split("x"))
    dk, dv = (int(x) for x in (dims or "32x64").split("x"))
    return b, h, n, dk, dv


def best_ms(fn, repeats):
    fn()  # warm-up: first-touch of the buffers, thread pool start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape,
                        default=[parse_shape(s) for s in
                                 ("1x4x1600:32x64", "4x2x1600:32x32", "16x8x400:32x32")],
                        help="B x heads x N : dk x dv (default: %(default)s)")
    parser.add_argument("--isas", nargs="+", default=None,
                        help="tile math copies to time (default: every copy this CPU runs)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls; the best is kept")
    args = parser.parse_args()
    isas = args.isas or _testing.cpu_isas()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"this CPU's copy: {psa_fa2_ext.build_info()['cpu_isa']}")
    print("| copy | B x heads x N | (dk, dv) | fwd ms | fwd+bwd ms |")
    print("|---|---|---|---|---|")
    torch.manual_seed(0)
    for isa in isas:
        for b, h, n, dk, dv in args.shapes:
            q = torch.randn(b, h, dk, n, requires_grad=True)
            k = torch.randn(b, h, dk, n, requires_grad=True)
            v = torch.randn(b, h, dv, n, requires_grad=True)
            with _testing.cpu_isa(isa):
                def forward():
                    return psa_fa2_ext.psa_attention(q, k, v)

                def forward_backward():
                    forward().sum().backward()

                fwd = best_ms(forward, args.repeats)
                fwd_bwd = best_ms(forward_backward, args.repeats)
            print(f"| {isa} | {b} x {h} x {n} | ({dk}, {dv}) | {fwd:.1f} | {fwd_bwd:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
