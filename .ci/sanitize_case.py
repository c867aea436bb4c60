"""A small forward + backward through every CUDA kernel family, for compute-sanitizer:
    compute-sanitizer --tool memcheck python .ci/sanitize_case.py
    compute-sanitizer --tool racecheck python .ci/sanitize_case.py"""
import torch

import psa_fa2_ext  # noqa: F401

torch.manual_seed(0)
for layout in ("channel_first", "token_major"):
    for N in (97, 400, 402, 1004):  # 2-, 16-, 4- and 8-byte channel-first copies
        for impl, deterministic in (("fast", False), ("fast", True), ("reference", False)):
            B, H, dk, dv = 1, 2, 32, 64
            if layout == "channel_first":
                x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=torch.bfloat16)
                q, k, v = (t.transpose(2, 3) for t in x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2))
            else:
                x = torch.randn(B, H, N, 2 * dk + dv, device="cuda", dtype=torch.bfloat16)
                q, k, v = x.split([dk, dk, dv], dim=3)
            out, lse = torch.ops.psa_fa2.fwd(q, k, v, dk ** -0.5, impl)
            dout = torch.randn_like(out)
            dq, dk_, dv_ = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
            torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, dk ** -0.5, dq, dk_, dv_, impl, deterministic)
torch.cuda.synchronize()
print("sanitize case done")
