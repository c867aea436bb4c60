"""Kernel time of the fast forward with K and V as tile images, as aligned rows and as given,
on a CUDA GPU (Hopper: the copies feed the wgmma kernel).

    python bench/tune/kv_tile_images.py [--dtype bf16] [--dv 64] [--shapes 1x2x62500 ...]

For each shape, the block's split views (rows N elements apart) run the forward three ways,
forced with psa_fa2_ext._testing.force: K / V copied to tile images (kv_images="always"),
without them (kv_images="never": the aligned row copies where the plan's thresholds say, else
the views as given), and with no copies at all (no_copies=True); with --warpgroups also on tile
images read by CTAs of two and of three warpgroups (kv_images="always" with
kv_image_warpgroups=2 / 3; "images" is the one the plan picks). Times are medians of
CUDA-graph replays (bench/bwd_schedules.py), device time only: the copies are part of the op's
time. Each shape runs the ways twice, in alternating order, and reports both; the gain is the
rows' time over the images'.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import psa_fa2_ext  # noqa: E402,F401  (registers torch.ops.psa_fa2)
from psa_fa2_ext import _testing  # noqa: E402
from bwd_schedules import DTYPES, graph_time_us, parse_shape  # noqa: E402

DK = 32
# Each way is the whole set of plan overrides (psa_fa2_ext._testing.force) it runs under.
WAYS = {
    "images": {"kv_images": "always"},
    "rows": {"kv_images": "never"},
    "none": {"no_copies": True},
}
IMAGE_KERNELS = {
    "2 wg": {"kv_images": "always", "kv_image_warpgroups": 2},
    "3 wg": {"kv_images": "always", "kv_image_warpgroups": 3},
}
DEFAULT_SHAPES = ["1x4x400", "16x4x400", "16x4x401", "64x4x400", "16x4x1600", "16x4x1601",
                  "16x4x1602", "16x4x1604", "8x4x6400", "8x4x6401", "8x4x6402", "8x4x6404",
                  "8x4x6408", "1x2x62500", "1x2x62499", "1x2x62464"]


def forward_time(q, k, v, overrides):
    """The kernels are planned when the graph is captured, so the overrides are set around it."""
    scale = DK ** -0.5
    with _testing.force(**overrides):
        return graph_time_us(lambda: torch.ops.psa_fa2.fwd(q, k, v, scale, "fast"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shapes", nargs="+", type=parse_shape,
                        default=[parse_shape(s) for s in DEFAULT_SHAPES], metavar="BxHxN")
    parser.add_argument("--dv", type=int, choices=[64, 32], default=64,
                        help="dv: 64 (PSA) or 32 (YOLO12's area attention, RT-DETR-l's AIFI)")
    parser.add_argument("--warpgroups", action="store_true",
                        help="also time the images with each CTA shape forced")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    ways = {**WAYS, **(IMAGE_KERNELS if args.warpgroups else {})}
    dv = args.dv
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, ({DK}, {dv}), forward, us\n")
    print("| B,H,N | " + " | ".join(ways) + " | gain |")
    print("|---|" + "---|" * (len(ways) + 1))
    for B, H, N in args.shapes:
        qkv = torch.randn(B, H, 2 * DK + dv, N, device="cuda", dtype=dtype).transpose(2, 3)
        q, k, v = qkv.split([DK, DK, dv], dim=3)
        first = {way: forward_time(q, k, v, ways[way]) for way in ways}
        second = {way: forward_time(q, k, v, ways[way]) for way in reversed(list(ways))}
        cells = [f"{first[w]:.1f} / {second[w]:.1f}" for w in ways]
        gain = (first["rows"] + second["rows"]) / (first["images"] + second["images"])
        print(f"| {B},{H},{N} | " + " | ".join(cells) + f" | {gain:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
