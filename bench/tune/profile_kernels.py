"""One forward and one backward of ours or of FlashAttention-4 at one shape, inside a
cudaProfilerStart / cudaProfilerStop region, so that Nsight Compute profiles the kernels of
the two side by side:

    ncu --profile-from-start off [--section ...] python bench/tune/profile_kernels.py \\
        --impl fa4 --shape 1x2x62500

`ours` runs the block's channel-first split views through psa_attention (autograd, as a
training step does); `fa4` runs flash_attn.cute's flash_attn_func on contiguous [B, N, H, D]
tensors made before the region, so that the region holds its attention kernels (and its
backward's pre- and post-processing) but none of the layout copies the benchmark charges it
for. Two unprofiled calls first compile FA4's kernels (JIT) and warm both up.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def ours_step(B, H, N, dk, dv, dtype):
    import psa_fa2_ext

    qkv = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(B, H, dv, N, device="cuda", dtype=dtype)

    def step():
        q, k, v = qkv.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
        out = psa_fa2_ext.psa_attention(q, k, v, dk ** -0.5)
        out.backward(dout)
    return step


def fa4_step(B, H, N, dk, dv, dtype):
    from flash_attn.cute import flash_attn_func

    q, k = (torch.randn(B, N, H, dk, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(2))
    v = torch.randn(B, N, H, dv, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(B, N, H, dv, device="cuda", dtype=dtype)

    def step():
        r = flash_attn_func(q, k, v, softmax_scale=dk ** -0.5)
        out = r[0] if isinstance(r, tuple) else r  # some releases also return lse
        out.backward(dout)
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["ours", "fa4"], required=True)
    ap.add_argument("--shape", default="1x2x62500", help="BxHxN")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--dk", type=int, default=32)
    ap.add_argument("--dv", type=int, default=64)
    args = ap.parse_args()
    B, H, N = (int(x) for x in args.shape.split("x"))
    make = ours_step if args.impl == "ours" else fa4_step
    step = make(B, H, N, args.dk, args.dv, DTYPES[args.dtype])
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{args.impl} {args.shape} {args.dtype} ({args.dk}, {args.dv}): one forward + backward profiled")


if __name__ == "__main__":
    main()
