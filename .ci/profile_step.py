"""Where a training step's time goes at the shipped YOLO shape (B=16, H=4, N=400, bf16):
host (CPU) time per call of each piece, synchronised only at the end of a loop (what the
host pays); then the whole step of ours and of SDPA (on contiguous copies of the views, as
the benchmark's peer) timed again and again, and the benchmark's own step row twice, to show
how much that host-bound wall clock moves in one process; then a torch.profiler table per
step for psa_attention and for SDPA.
    python .ci/profile_step.py"""
import os
import sys
import time
import types

import torch
from torch.profiler import ProfilerActivity, profile

import psa_fa2_ext

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import measure  # noqa: E402
import peers  # noqa: E402

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


def ours_zeroed():
    ours()
    x.grad = None   # as optimizer.zero_grad() does


def sdpa_contiguous_zeroed():
    q, k, v = (t.transpose(-2, -1).contiguous() for t in views(x))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out.transpose(-2, -1).contiguous().backward(g)
    x.grad = None


print("\n| round | ours, grad accumulating | ours, grad = None | SDPA on contiguous copies |\n"
      "|---|---|---|---|")
for r in range(3):
    cells = [host_us(fn, 2000)[1] for fn in (ours, ours_zeroed, sdpa_contiguous_zeroed)]
    print(f"| {r} | " + " | ".join(f"{c:.1f} us" for c in cells) + " |")
x.grad = None
case = peers.Case(dk=dk, dv=dv, scale=dk ** -0.5, dtype=x.dtype, device=x.device)
for _ in range(2):
    row = measure.eager_step_row(case, xd, H, g, types.SimpleNamespace(warmup=3, target_s=0.2))
    print(f"benchmark step row: ours {row['ours_us']:.1f} us, SDPA auto {row['sdpa_us']:.1f} us, "
          f"eager {row['eager_us']:.1f} us, SDPA / ours {row['sdpa_over_ours']:.2f}")

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
