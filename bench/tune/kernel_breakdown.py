"""Device time per kernel of one call of ours, forward and forward + backward through autograd,
on the block's views (what the benchmark's "ours" rows sum), from the profiler:

    python bench/tune/kernel_breakdown.py [--shapes 1x2x62500 8x4x6400] [--dtype bf16]
    python bench/tune/kernel_breakdown.py --block aifi --head-dims 32x32 --shapes 16x8x400

psa: split views of one [B, H*(2dk+dv), N] conv output. aifi: RT-DETR's three [B, N, H*D]
projections viewed as heads [B, H, N, D], the output back to [B, N, H*dv] (bench/peers.py).
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import psa_fa2_ext  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CALLS = 5


def psa_case(B, H, N, dk, dv, dtype):
    """(leaves, attention output from the leaves, dout) for the PSA block's split views."""
    qkv = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=dtype, requires_grad=True)

    def attend():
        return psa_fa2_ext.psa_attention(*qkv.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2))
    return [qkv], attend, torch.randn(B, H, dv, N, device="cuda", dtype=dtype)


def aifi_case(B, H, N, dk, dv, dtype):
    """The same for AIFI's head views of three projections."""
    proj = [torch.randn(B, N, H * d, device="cuda", dtype=dtype, requires_grad=True)
            for d in (dk, dk, dv)]

    def attend():
        q, k, v = (x.view(B, N, H, -1).transpose(1, 2) for x in proj)
        return psa_fa2_ext.attention(q, k, v).transpose(1, 2).reshape(B, N, H * dv)
    return proj, attend, torch.randn(B, N, H * dv, device="cuda", dtype=dtype)


CASES = {"psa": psa_case, "aifi": aifi_case}


def breakdown(block, B, H, N, dk, dv, dtype):
    leaves, attend, dout = CASES[block](B, H, N, dk, dv, dtype)

    def forward():
        with torch.no_grad():
            attend()

    def forward_backward():
        attend().backward(dout)
        for x in leaves:
            x.grad = None

    for mode, run in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                run()
            torch.cuda.synchronize()
        print(f"== {block} {B}x{H}x{N} {mode}, per call")
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = 0.0
        for e in sorted(events, key=lambda e: -e.device_time_total):
            us = e.device_time_total / CALLS
            total += us
            print(f"  {us:10.1f} us  x{e.count // CALLS}  {e.key[:110]}")
        print(f"  {total:10.1f} us  total")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["1x2x62500", "8x4x6400"], metavar="BxHxN")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--head-dims", default="32x64", metavar="DKxDV")
    p.add_argument("--block", choices=CASES, default="psa")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernel_breakdown.py needs a CUDA GPU")
    dk, dv = (int(x) for x in args.head_dims.split("x"))
    for shape in args.shapes:
        B, H, N = (int(x) for x in shape.split("x"))
        breakdown(args.block, B, H, N, dk, dv, DTYPES[args.dtype])


if __name__ == "__main__":
    main()
