"""The two bf16 / fp16 forward kernels side by side on a Hopper GPU: the wgmma one
(csrc/cuda/kernels/fwd_sm90.cuh, the default there) and the mma.sync one that other GPUs run
(forced with psa_fa2_ext._testing.force(no_sm90=True)), on the benchmark's shapes, (32, 64)
or (with --dv 32) YOLO12's (32, 32), channel-first (the block's views) or token-major.

    python bench/fwd_kernels.py [--dtypes bf16 fp16] [--shapes 16x4x400 ...] [--layouts cf tm]
                                [--dv 64|32]

Kernel time as in bwd_schedules.py (median of CUDA-graph replays, device time only), and the
largest difference between the two outputs. Prints a markdown table.
"""
import argparse
import contextlib
import itertools

import torch

import psa_fa2_ext  # noqa: F401  (registers torch.ops.psa_fa2)
from bwd_schedules import DTYPES, SHAPES, graph_time_us, mma_sync_kernels, parse_shape, runs_wgmma


def forward_time_us(q, k, v, disable_sm90):
    """The kernel is planned when the graph is captured, so the override is set around it."""
    with mma_sync_kernels() if disable_sm90 else contextlib.nullcontext():
        out = torch.ops.psa_fa2.fwd(q, k, v, q.shape[-1] ** -0.5, "fast")[0]
        return graph_time_us(lambda: torch.ops.psa_fa2.fwd(q, k, v, q.shape[-1] ** -0.5, "fast")), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16"])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES, metavar="BxHxN")
    parser.add_argument("--layouts", nargs="+", choices=["cf", "tm"], default=["cf"])
    parser.add_argument("--dv", type=int, choices=[64, 32], default=64, help="dk is 32")
    args = parser.parse_args()
    if torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("the wgmma forward runs on compute capability 9.0 (Hopper) only")
    if "wgmma" not in psa_fa2_ext.build_info()["cuda_kernels"]:
        raise SystemExit("this build has no wgmma forward (build for TORCH_CUDA_ARCH_LIST=9.0a)")
    dk, dv = 32, args.dv
    if not runs_wgmma(dk, dv, "fwd"):
        raise SystemExit(f"this build has no wgmma forward at ({dk}, {dv})")
    print(f"{torch.cuda.get_device_name()}, ({dk}, {dv})\n")
    print("| dtype | layout | B,H,N | wgmma us | mma.sync us | speed-up | TFLOP/s (wgmma) "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name, layout in itertools.product(args.dtypes, args.layouts):
        for B, H, N in args.shapes:
            if layout == "cf":  # the split views of the qkv conv output
                x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=DTYPES[name])
                q, k, v = (t.transpose(2, 3) for t in
                           x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2))
            else:
                x = torch.randn(B, H, N, 2 * dk + dv, device="cuda", dtype=DTYPES[name])
                q, k, v = x.split([dk, dk, dv], dim=3)
            t_wgmma, out_wgmma = forward_time_us(q, k, v, disable_sm90=False)
            t_sync, out_sync = forward_time_us(q, k, v, disable_sm90=True)
            flops = 2.0 * B * H * N * N * (dk + dv)
            diff = (out_wgmma.float() - out_sync.float()).abs().max().item()
            print(f"| {name} | {layout} | {B},{H},{N} | {t_wgmma:.1f} | {t_sync:.1f} | {t_sync / t_wgmma:.2f}x "
                  f"| {flops / t_wgmma / 1e6:.0f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main()
