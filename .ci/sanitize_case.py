"""A small forward + backward through every CUDA kernel family, for compute-sanitizer:
    compute-sanitizer --tool memcheck python .ci/sanitize_case.py [part ...]
    compute-sanitizer --tool racecheck python .ci/sanitize_case.py [part ...]
The parts (all by default): families (every bf16 kernel family, both layouts), images (the
Hopper kernels on tile images, bulk copies and mbarriers), fp32, autograd. racecheck of all of
them takes minutes; of one part, seconds to a minute."""
import itertools
import os
import sys

import torch

import psa_fa2_ext


def families():
    # On Hopper the bf16 forward and schedule (a) of the backward are the wgmma kernels;
    # PSA_FA2_DISABLE_SM90=1 runs the mma.sync ones.
    for disable_sm90, layout in itertools.product(("0", "1"), ("channel_first", "token_major")):
        os.environ["PSA_FA2_DISABLE_SM90"] = disable_sm90
        # 2-, 16-, 4- and 8-byte channel-first copies; at 401 the wgmma forward copies K and V to
        # aligned rows first (copy_rows.cu), at 1601 the wgmma backward Q and dO too.
        for N in (97, 400, 402, 1004, 401, 1601):
            for impl, deterministic in (("fast", False), ("fast", True), ("reference", False)):
                B, H, dk, dv = 1, 2, 32, 64
                if layout == "channel_first":
                    x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=torch.bfloat16)
                    views = x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2)
                    q, k, v = (t.transpose(2, 3) for t in views)
                else:
                    x = torch.randn(B, H, N, 2 * dk + dv, device="cuda", dtype=torch.bfloat16)
                    q, k, v = x.split([dk, dk, dv], dim=3)
                out, lse = torch.ops.psa_fa2.fwd(q, k, v, dk ** -0.5, impl)
                dout = torch.randn_like(out)
                dq, dk_, dv_ = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
                torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, dk ** -0.5, dq, dk_, dv_, impl,
                                      deterministic)
    os.environ.pop("PSA_FA2_DISABLE_SM90")


def images():
    # The wgmma forward on K / V tile images (bulk copies, mbarriers, CTAs of two and of three
    # warpgroups; Hopper): one partial tile, 26 tiles with a partial last one (2-byte Q / out rows)
    # and 26 whole ones (16-byte rows), 13 steps of two tiles for three warpgroups; at 1601 the
    # last CTA's third warpgroup has no rows. Each also with rising scores (tiles redone).
    for warpgroups in ("2", "3"):
        os.environ["PSA_FA2_KV_TILE_IMAGES"] = warpgroups
        for N in (37, 1601, 1664):
            x = torch.randn(1, 2 * 128, N, device="cuda", dtype=torch.bfloat16)
            q, k, v = (t.transpose(2, 3) for t in x.view(1, 2, 128, N).split([32, 32, 64], 2))
            torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
            # Scores rising along the keys: the row max jumps, and tiles are redone.
            q[..., 0] = 1
            k[..., 0] = torch.linspace(0, 48 / (32 ** -0.5 * 1.4426950408889634), N, device="cuda")
            torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
    os.environ.pop("PSA_FA2_KV_TILE_IMAGES")
    # The wgmma backward on stream images of Q and dO (bulk copies, mbarriers; Hopper): one partial
    # step, and 26 steps with a partial last one (2-byte K / V rows), on two heads.
    os.environ["PSA_FA2_BWD_STREAM_IMAGES"] = "1"
    for N in (37, 1601):
        x = torch.randn(1, 2 * 128, N, device="cuda", dtype=torch.bfloat16)
        q, k, v = (t.transpose(2, 3) for t in x.view(1, 2, 128, N).split([32, 32, 64], 2))
        out, lse = torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
        dout = torch.randn_like(out)
        dq, dk_, dv_ = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
        torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, 32 ** -0.5, dq, dk_, dv_, "fast", False)
    os.environ.pop("PSA_FA2_BWD_STREAM_IMAGES")


def fp32():
    # fp32: the exact forward ("highest") and the TF32 one ("high"), and the FFMA backward, at
    # masked tails (97 tokens: two key tiles, the second partial; four row steps, the last of one).
    # Both sizes split the forward's keys, exact and TF32 (2 and 7 CTAs per row tile, then the
    # combine).
    for precision, N, layout_dims in itertools.product(("highest", "high"), (97, 1025),
                                                       ((2, 3), None)):
        torch.set_float32_matmul_precision(precision)
        x = torch.randn(1, 2 * 128, N, device="cuda")
        q, k, v = x.view(1, 2, 128, N).split([32, 32, 64], 2)
        if layout_dims:
            q, k, v = (t.transpose(*layout_dims) for t in (q, k, v))
        else:
            q, k, v = (t.transpose(2, 3).contiguous() for t in (q, k, v))
        out, lse = torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
        dout = torch.randn_like(out)
        dq, dk_, dv_ = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
        torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, 32 ** -0.5, dq, dk_, dv_, "fast", False)
    torch.set_float32_matmul_precision("highest")


def autograd():
    # psa_attention's autograd on the split views (one d_qkv buffer).
    x = torch.randn(2, 2 * 128, 19, 21, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    psa_fa2_ext.psa_attention(*x.view(2, 2, 128, 399).split([32, 32, 64], 2)).sum().backward()


PARTS = {"families": families, "images": images, "fp32": fp32, "autograd": autograd}

if __name__ == "__main__":
    unknown = [name for name in sys.argv[1:] if name not in PARTS]
    if unknown:
        sys.exit(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
    torch.manual_seed(0)
    for name in sys.argv[1:] or PARTS:
        PARTS[name]()
    torch.cuda.synchronize()
    print("sanitize case done")
