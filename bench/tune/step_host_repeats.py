"""The eager training step at B, H, N = 16, 4, 400 (bf16), timed again and again in one bare
process (nothing else imported or run before), to see how much its host-bound wall clock moves:

    python bench/tune/step_host_repeats.py

Prints, per round, a synchronised loop of 2000 steps of psa_attention (the qkv gradient
accumulating, and set to None after each step as optimizer.zero_grad() does) and of SDPA on
contiguous copies of the views; then the benchmark's own eager-step row (bench/measure.py)
twice."""
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import measure  # noqa: E402
import peers  # noqa: E402
import psa_fa2_ext  # noqa: E402

B, H, DK, DV, N = 16, 4, 32, 64, 400
x = torch.randn(B, H * (2 * DK + DV), 20, 20, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dout = torch.randn(B, H, DV, N, device="cuda", dtype=torch.bfloat16)


def views(t):
    return t.view(B, H, 2 * DK + DV, N).split([DK, DK, DV], dim=2)


def ours_accumulating():
    psa_fa2_ext.psa_attention(*views(x)).backward(dout)


def ours_zeroed():
    psa_fa2_ext.psa_attention(*views(x)).backward(dout)
    x.grad = None


def sdpa_zeroed():
    q, k, v = (t.transpose(-2, -1).contiguous() for t in views(x))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out.transpose(-2, -1).contiguous().backward(dout)
    x.grad = None


def step_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


for r in range(3):
    print(f"round {r}: ours, grad accumulating {step_us(ours_accumulating):.1f} us; ours, grad=None "
          f"{step_us(ours_zeroed):.1f} us; SDPA (contiguous copies), grad=None {step_us(sdpa_zeroed):.1f} us")
case = peers.Case(dk=DK, dv=DV, scale=DK ** -0.5, dtype=torch.bfloat16, device=torch.device("cuda"))
cfg = types.SimpleNamespace(warmup=3, target_s=0.2)
for _ in range(2):
    row = measure.eager_step_row(case, x.detach(), H, dout, cfg)
    print(f"bench eager_step_row: ours {row['ours_us']:.1f} us, SDPA auto {row['sdpa_us']:.1f} us, "
          f"eager {row['eager_us']:.1f} us, SDPA/ours {row['sdpa_over_ours']:.2f}")
