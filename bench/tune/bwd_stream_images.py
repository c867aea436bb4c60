"""Kernel time of the fast backward with Q and dO as stream images and without, on a Hopper
GPU (the images feed the wgmma backward):

    python bench/tune/bwd_stream_images.py [--dtype bf16] [--dv 64] [--shapes 1x2x62500 ...]

For each shape, the block's split views (rows N elements apart) run torch.ops.psa_fa2.bwd
(schedule (a)) with Q and dO copied to stream images and without, forced with
psa_fa2_ext._testing.force (stream_images="always"; "never": the aligned row copies where the
plan's thresholds say, else the views as given). Times are medians of CUDA-graph replays
(bench/bwd_schedules.py), device time only: the preprocess, the copies and the dQ conversion
are part of the op's time. Each shape runs both ways twice, in alternating order, and reports
both; the gain is the rows' time over the images'.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import psa_fa2_ext  # noqa: E402,F401  (registers torch.ops.psa_fa2)
from bwd_schedules import DTYPES, bwd_inputs, graph_time_us, parse_shape  # noqa: E402
from psa_fa2_ext import _testing  # noqa: E402

DK = 32
# Each way is the whole set of plan overrides (psa_fa2_ext._testing.force) it runs under.
WAYS = {"images": {"stream_images": "always"}, "rows": {"stream_images": "never"}}
DEFAULT_SHAPES = ["1x4x400", "16x4x400", "64x4x400", "16x4x1600", "16x4x1601", "8x4x6400",
                  "8x4x6401", "8x4x6404", "2x4x12800", "1x2x62500", "1x2x62464"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shapes", nargs="+", type=parse_shape,
                        default=[parse_shape(s) for s in DEFAULT_SHAPES], metavar="BxHxN")
    parser.add_argument("--dv", type=int, choices=[64, 32], default=64,
                        help="dv: 64 (PSA) or 32 (YOLO12's area attention, RT-DETR-l's AIFI)")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, ({DK}, {args.dv}), backward, us\n")
    print("| B,H,N | " + " | ".join(WAYS) + " | gain |")
    print("|---|" + "---|" * (len(WAYS) + 1))
    for B, H, N in args.shapes:
        inputs = bwd_inputs(B, H, N, dtype, DK, args.dv)

        def timed(way):  # planned when the graph is captured: the overrides are set around it
            with _testing.force(**WAYS[way]):
                return graph_time_us(lambda: torch.ops.psa_fa2.bwd(*inputs, "fast", False))

        first = {way: timed(way) for way in WAYS}
        second = {way: timed(way) for way in reversed(list(WAYS))}
        cells = [f"{first[w]:.1f} / {second[w]:.1f}" for w in WAYS]
        gain = (first["rows"] + second["rows"]) / (first["images"] + second["images"])
        print(f"| {B},{H},{N} | " + " | ".join(cells) + f" | {gain:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
