"""Kernel time of the fast forward and backward against the row stride of the channel-first
views, on a CUDA GPU.

    python bench/tune/row_stride.py [--dtype bf16] [--shapes 1x2x62500 ...] [--strides]

For each shape, the block's split views (rows N elements apart) with the Hopper kernels'
copies (csrc/cuda/aligned_rows.h: aligned rows, or K / V tile images and Q / dO stream images
where the plan picks them) and without any (psa_fa2_ext._testing.force(no_copies=True)).
With --strides, also the views on rows padded to 8 and 64 elements (16- / 128-byte rows),
which need no copies. Times are medians of CUDA-graph replays (bench/bwd_schedules.py), device
time only: the copies are part of the op's time.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import psa_fa2_ext  # noqa: E402,F401  (registers torch.ops.psa_fa2)
from psa_fa2_ext import _testing  # noqa: E402
from bwd_schedules import DTYPES, graph_time_us, parse_shape  # noqa: E402

DK, DV = 32, 64


def views(B, H, N, stride, channels, dtype):
    """[B, H, N, D] channel-first views of `channels` rows, `stride` elements apart."""
    base = torch.randn(B, H, channels, stride, device="cuda", dtype=dtype)[..., :N]
    return base.transpose(2, 3)


def copies(enabled):
    """The kernels are planned when the graph is captured, so the override is set around it."""
    return _testing.force(no_copies=not enabled)


def times(B, H, N, stride, dtype, with_copies):
    qkv = views(B, H, N, stride, 2 * DK + DV, dtype)
    q, k, v = qkv.split([DK, DK, DV], dim=3)
    scale = DK ** -0.5
    dout = views(B, H, N, stride, DV, dtype)
    grads = views(B, H, N, stride, 2 * DK + DV, dtype)
    dq, dk, dv = grads.split([DK, DK, DV], dim=3)
    with copies(with_copies):
        t_fwd = graph_time_us(lambda: torch.ops.psa_fa2.fwd(q, k, v, scale, "fast"))
        out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, "fast")
        t_bwd = graph_time_us(lambda: torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq,
                                                            dk, dv, "fast", False, False))
    return t_fwd, t_bwd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shapes", nargs="+", type=parse_shape,
                        default=[(16, 4, 401), (8, 4, 6401), (1, 2, 62500)], metavar="BxHxN")
    parser.add_argument("--strides", action="store_true", help="also time padded row strides")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, ({DK}, {DV})\n")
    print("| B,H,N | fwd us, copies | fwd us, none | gain | bwd us, copies | bwd us, none | gain |")
    print("|---|---|---|---|---|---|---|")
    for B, H, N in args.shapes:
        (f1, b1), (f0, b0) = (times(B, H, N, N, dtype, c) for c in (True, False))
        print(f"| {B},{H},{N} | {f1:.1f} | {f0:.1f} | {f0 / f1:.2f}x | {b1:.1f} | {b0:.1f} | "
              f"{b0 / b1:.2f}x |", flush=True)
    if args.strides:
        print("\n| B,H,N | row stride | fwd us | bwd us |\n|---|---|---|---|")
        for B, H, N in args.shapes:
            for stride in sorted({N, -(-N // 8) * 8, -(-N // 64) * 64}):
                t_fwd, t_bwd = times(B, H, N, stride, dtype, True)
                print(f"| {B},{H},{N} | {stride} | {t_fwd:.1f} | {t_bwd:.1f} |", flush=True)


if __name__ == "__main__":
    main()
