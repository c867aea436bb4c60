"""Where a training step's time goes at the shipped YOLO shape (B=16, H=4, N=400, bf16):
host (CPU) time per call of each piece, synchronised only at the end of a loop (what the
host pays), then a torch.profiler table per step for psa_attention and for SDPA.
    python .ci/profile_step.py"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

import psa_fa2_ext

B, H, dk, dv, N = 16, 4, 32, 64, 400
x = torch.randn(B, H * (2 * dk + dv), 20, 20, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, H, dv, N, device="cuda", dtype=torch.bfloat16)


def views(t):
    return t.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)


def ours():
    psa_fa2_ext.psa_attention(*views(x)).backward(g)


def sdpa():
    q, k, v = views(x)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1))
    out.transpose(-2, -1).contiguous().backward(g)


xd = x.detach()
q, k, v = (t.transpose(2, 3) for t in views(xd))
out, lse = torch.ops.psa_fa2.fwd(q, k, v, dk ** -0.5, "auto")
dout = g.transpose(2, 3)
d_base = torch.empty_like(xd)
dq, dk_, dv_ = (t.transpose(2, 3) for t in views(d_base))


def host_us(fn, n=500):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / n * 1e6, (time.perf_counter() - t0) / n * 1e6


pieces = {
    "views only": lambda: views(x),
    "fwd op": lambda: torch.ops.psa_fa2.fwd.default(q, k, v, dk ** -0.5, "auto"),
    "bwd op": lambda: torch.ops.psa_fa2.bwd.default(dout, q, k, v, out, lse, dk ** -0.5, dq, dk_,
                                                    dv_, "auto", False, False),
    "empty d_qkv": lambda: torch.empty_like(xd),
    "psa_attention fwd (grad)": lambda: psa_fa2_ext.psa_attention(*views(x)),
    "psa_attention fwd+bwd": ours,
    "sdpa fwd+bwd": sdpa,
}
print("| piece | host us / call | wall us / call |\n|---|---|---|")
for name, fn in pieces.items():
    h, w = host_us(fn)
    print(f"| {name} | {h:.1f} | {w:.1f} |")

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
