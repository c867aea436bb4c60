"""Where a training step's time goes at the shipped YOLO shape (B=16, H=4, N=400, bf16):
host (CPU) time per op and the GPU kernels, for psa_attention and for SDPA.
    python .ci/profile_step.py"""
import torch
from torch.profiler import ProfilerActivity, profile

import psa_fa2_ext

B, H, dk, dv, N = 16, 4, 32, 64, 400
x = torch.randn(B, H * (2 * dk + dv), 20, 20, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, H, dv, N, device="cuda", dtype=torch.bfloat16)


def ours():
    q, k, v = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    psa_fa2_ext.psa_attention(q, k, v).backward(g)


def sdpa():
    q, k, v = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1))
    out.transpose(-2, -1).contiguous().backward(g)


for name, step in (("psa_attention", ours), ("sdpa", sdpa)):
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    print(f"===== {name}: 20 steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
