"""A small forward + backward through every CUDA kernel family, for compute-sanitizer:
    compute-sanitizer --tool memcheck python .ci/sanitize_case.py [part ...]
    compute-sanitizer --tool racecheck python .ci/sanitize_case.py [part ...]
The parts (all by default): families (every bf16 kernel family, both layouts), images (the
Hopper kernels on tile images, bulk copies and mbarriers), fp32, autograd, strides (area views,
head views of a projection, more (b, h) pairs than a grid holds). racecheck of all of
them takes minutes; of one part, seconds to a minute."""
import itertools
import sys

import torch

import psa_fa2_ext
from psa_fa2_ext import _testing


def channel_first_views(N, dtype=torch.bfloat16, B=1, H=2, dk=32, dv=64):
    """q, k, v as the block makes them: split views of one [B, H*(2dk+dv), N] tensor, logical
    [B, H, N, D] (N has stride 1)."""
    x = torch.randn(B, H * (2 * dk + dv), N, device="cuda", dtype=dtype)
    return [t.transpose(2, 3) for t in x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2)]


def forward_backward(q, k, v, impl="fast", deterministic=False):
    """One forward and one backward through the ops, on fresh gradient buffers."""
    scale = q.shape[-1] ** -0.5
    out, lse = torch.ops.psa_fa2.fwd(q, k, v, scale, impl)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.empty_like(v)
    torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, impl, deterministic)


def families():
    # On Hopper the bf16 forward and schedule (a) of the backward are the wgmma kernels;
    # forcing no_sm90 runs the mma.sync ones.
    for no_sm90, layout in itertools.product((False, True), ("channel_first", "token_major")):
        with _testing.force(no_sm90=no_sm90):
            # 2-, 16-, 4- and 8-byte channel-first copies; at 401 the wgmma forward copies K and
            # V to aligned rows first (copy_rows.cu), at 1601 the wgmma backward Q and dO too.
            for N in (97, 400, 402, 1004, 401, 1601):
                for impl, deterministic in (("fast", False), ("fast", True), ("reference", False)):
                    if layout == "channel_first":
                        q, k, v = channel_first_views(N)
                    else:
                        x = torch.randn(1, 2, N, 128, device="cuda", dtype=torch.bfloat16)
                        q, k, v = x.split([32, 32, 64], dim=3)
                    forward_backward(q, k, v, impl, deterministic)


def images():
    # The wgmma forward on K / V tile images (bulk copies, mbarriers, CTAs of two and of three
    # warpgroups; Hopper): one partial tile, 26 tiles with a partial last one (2-byte Q / out rows)
    # and 26 whole ones (16-byte rows), 13 steps of two tiles for three warpgroups; at 1601 the
    # last CTA's third warpgroup has no rows. Each also with rising scores (O rescaled). At
    # dv = 64 and 32.
    for warpgroups, N, dv in itertools.product((2, 3), (37, 1601, 1664), (64, 32)):
        with _testing.force(kv_images="always", kv_image_warpgroups=warpgroups):
            q, k, v = channel_first_views(N, dv=dv)
            torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
            # Scores rising along the keys: the row max jumps, and O is rescaled.
            q[..., 0] = 1
            k[..., 0] = torch.linspace(0, 48 / (32 ** -0.5 * 1.4426950408889634), N, device="cuda")
            torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "fast")
    # The wgmma backward on stream images of Q and dO (bulk copies, mbarriers; Hopper): one partial
    # step, and 26 steps with a partial last one (2-byte K / V rows), on two heads.
    with _testing.force(stream_images="always"):
        for N, dv in itertools.product((37, 1601), (64, 32)):
            forward_backward(*channel_first_views(N, dv=dv))


def fp32():
    # fp32: the exact forward ("highest") and the TF32 one ("high"), and the FFMA backward, at
    # masked tails (97 tokens: two key tiles, the second partial; four row steps, the last of one).
    # Both sizes split the forward's keys, exact and TF32 (2 and 7 CTAs per row tile, then the
    # combine).
    for precision, N, channel_first, dv in itertools.product(("highest", "high"), (97, 1025),
                                                             (True, False), (64, 32)):
        torch.set_float32_matmul_precision(precision)
        q, k, v = channel_first_views(N, torch.float32, dv=dv)
        if not channel_first:
            q, k, v = (t.contiguous() for t in (q, k, v))
        forward_backward(q, k, v)
    torch.set_float32_matmul_precision("highest")


def autograd():
    # psa_attention's autograd on the split views (one d_qkv buffer).
    x = torch.randn(2, 2 * 128, 19, 21, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    psa_fa2_ext.psa_attention(*x.view(2, 2, 128, 399).split([32, 32, 64], 2)).sum().backward()


def strides():
    # Operands and outputs whose strides the block views above do not have: YOLO12's area views
    # (heads are runs of N: head stride N / area below the head-dim stride N, in the output
    # too), AIFI's token-major head views (output token stride H * dv), and a call of more
    # (b, h) pairs than a grid holds (launches on narrowed views). Both kernel generations.
    for no_sm90 in (False, True):
        with _testing.force(no_sm90=no_sm90):
            for N, area in ((1600, 4), (1200, 4), (28, 4)):
                x = torch.randn(2, 2 * 96, N, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True)
                q, k, v = x.view(2, 2, 96, N).split([32, 32, 32], 2)
                psa_fa2_ext.psa_attention(q, k, v, area=area).sum().backward()
            x = torch.randn(2, 401, 3 * 256, device="cuda", dtype=torch.float16, requires_grad=True)
            q, k, v = (t.view(2, 401, 8, 32).transpose(1, 2) for t in x.split(256, -1))
            psa_fa2_ext.attention(q, k, v).sum().backward()
            forward_backward(*channel_first_views(17, B=70000, H=1, dv=32))


PARTS = {"families": families, "images": images, "fp32": fp32, "autograd": autograd,
         "strides": strides}

if __name__ == "__main__":
    unknown = [name for name in sys.argv[1:] if name not in PARTS]
    if unknown:
        sys.exit(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
    torch.manual_seed(0)
    for name in sys.argv[1:] or PARTS:
        PARTS[name]()
    torch.cuda.synchronize()
    print("sanitize case done")
