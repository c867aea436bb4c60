"""What a GPU with 99 KB of shared memory per block (RTX 30 / 40 / 50) runs, timed on a Hopper
GPU: kernel time of the plan told the device has 99 KB per block, against the mma.sync plan
with the device's own shared memory (what an A100-class plan picks on this GPU) and against
this GPU's default plan. A proxy: a consumer card has other SM counts, clocks and caches; what
it shows is the cost of the smaller configurations, on the same chip.

    python bench/small_smem_plans.py [--dtypes bf16 fp16 fp32] [--head-dims 32x64 ...]
                                     [--shapes 16x4x400 ...] [--smem-kb 99]

Kernel time as in bwd_schedules.py (median of CUDA-graph replays, device time only). Where a
configuration does not fit the smaller shared memory the plan runs blockwise on at::matmul,
and the table says so. Prints a markdown table.
"""
import argparse
import warnings

import torch

import psa_fa2_ext  # noqa: F401  (registers torch.ops.psa_fa2)
from bwd_schedules import SHAPES, graph_time_us, parse_shape
from psa_fa2_ext import _plan, _testing

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_dims(text):
    dk, dv = (int(x) for x in text.lower().split("x"))
    return dk, dv


def split_views(x, H, dk, dv):
    """[B, H, N, D] channel-first views of a [B, H*(2dk+dv), N] tensor, as the block's."""
    B, _, N = x.shape
    return [t.transpose(2, 3) for t in x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2)]


def channel_first_inputs(B, H, N, dk, dv, dtype):
    """q, k, v as the PSA block makes them, a dout for the backward, and gradient buffers in
    the same layout (one qkv-shaped buffer, as psa_attention's backward writes)."""
    x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=dtype)
    q, k, v = split_views(x, H, dk, dv)
    dout = torch.randn(B, H, dv, N, device="cuda", dtype=dtype).transpose(2, 3)
    return q, k, v, dout, split_views(torch.empty_like(x), H, dk, dv)


def times_us(q, k, v, dout, grads, force):
    """(forward, backward) kernel times with the plan overrides `force`; the plans are made
    when the graphs are captured, inside the block."""
    scale = q.shape[-1] ** -0.5
    with _testing.force(**force), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the blockwise fallback's one-time note
        out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, "auto")
        dq, dk, dv = grads
        fwd = graph_time_us(lambda: torch.ops.psa_fa2.fwd(q, k, v, scale, "auto"))
        bwd = graph_time_us(lambda: torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq, dk,
                                                          dv, "auto", False, False))
    return fwd, bwd


def kernel_name(direction, q, k, v, force):
    """The kernel family the ops plan for the call here (the plan description's first word)."""
    major, minor = torch.cuda.get_device_capability()
    props = torch.cuda.get_device_properties(0)
    built = psa_fa2_ext.build_info()["cuda_kernels"]
    device = (major, minor, props.multi_processor_count,
              getattr(props, "shared_memory_per_block_optin", 227 * 1024),
              (major, minor) == (9, 0) and "wgmma" in built, True)
    return _plan.plan(direction, q, k, v, device=device, force=force)[0].split()[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16", "fp16", "fp32"])
    p.add_argument("--head-dims", nargs="+", type=parse_dims, default=[(32, 64)], metavar="DKxDV")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES, metavar="BxHxN")
    p.add_argument("--smem-kb", type=int, default=99)
    args = p.parse_args()
    small = {"no_sm90": True, "smem_per_block": args.smem_kb * 1024}
    configs = {"default": {}, "mma.sync": {"no_sm90": True}, f"{args.smem_kb} KB": small}
    assert torch.get_float32_matmul_precision() == "highest"  # fp32: the exact kernels
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; kernel time, us; "
          f"fp32 at matmul precision \"highest\"\n")
    print(f"| dtype | dk×dv | B×H×N | dir | default | mma.sync | {args.smem_kb} KB "
          f"| {args.smem_kb} KB / mma.sync | {args.smem_kb} KB / default | {args.smem_kb} KB kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.dtypes:
        for dk, dv in args.head_dims:
            for B, H, N in args.shapes:
                q, k, v, dout, grads = channel_first_inputs(B, H, N, dk, dv, DTYPES[name])
                t = {c: times_us(q, k, v, dout, grads, f) for c, f in configs.items()}
                for i, direction in enumerate(("fwd", "bwd")):
                    d, m, s = (t[c][i] for c in configs)
                    print(f"| {name} | {dk}×{dv} | {B}×{H}×{N} | {direction} | {d:.1f} | {m:.1f} "
                          f"| {s:.1f} | {s / m:.2f} | {s / d:.2f} "
                          f"| {kernel_name(direction, q, k, v, small)} |", flush=True)
                del q, k, v, dout, grads
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
