"""Where a 16-bit forward's output error comes from: our kernels, SDPA's backends and emulations
of single rounding steps, on the same inputs, against float64.

    python bench/tune/output_error_sources.py                      # GPU: 64x2x400 and 16x8x400
    python bench/tune/output_error_sources.py --device cpu --shapes 8x2x400

The error is the benchmark's (bench/reference.py rel_err): max |out - ref| / max |ref|, or with
`--stat mean` the mean |out - ref| / mean |ref|, which is what tests/test_fast_kernels.py holds
the 16-bit forwards to: the max is decided by a single output's final rounding and moves by
tens of percent from seed to seed, the mean over a million outputs by tenths of a percent.
Each row gives the range over the seeds and, per seed, the ratio to "P rounded". The
emulations compute in float64 on the same device and round only where they say:
- "exact, rounded once": the float64 result rounded to the dtype, the floor every kernel meets;
- "P rounded": the probabilities rounded to the dtype before P V, row sums from unrounded P
  (FlashAttention-2's scheme), the rest exact;
- "P rounded, online": the same as a FlashAttention-2 kernel does it, over tiles of 128 keys,
  each exponentiated against the running max of the row (exact: each tile's largest raises it);
- "P rounded, online, rounded sums": the same with the row sums taken of the rounded P, as P V
  reads it (a kernel that sums P on the tensor cores, with ones after V:
  bench/tune/patches/sm90_fwd_sums_by_mma.patch);
- "P rounded, lazy max": the same with each row's reference max that of its first 64 keys, so
  probabilities reach 2^8 as in our Hopper forward before it took the exact max (its error
  matched this row on an H100: bench/results/h100-2026-12-07-dd74569).
A kernel well above "P rounded" rounds somewhere else too; the kernel rows name which of ours
ran (psa_fa2_ext._testing.force)."""
import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import psa_fa2_ext  # noqa: E402
from psa_fa2_ext import _testing  # noqa: E402
from reference import rel_err  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def emulate(q, k, v, scale, dtype, lazy_keys=None):
    """softmax(q k^T scale) v in float64 with P rounded to dtype (and, with lazy_keys, each
    row's exponent offset taken from its first lazy_keys keys only), then the output rounded."""
    s = (q @ k.transpose(-1, -2)) * scale
    m = (s[..., :lazy_keys] if lazy_keys else s).amax(-1, keepdim=True)
    p = torch.exp(s - m)
    out = (p.to(dtype).double() @ v) / p.sum(-1, keepdim=True)
    return out.to(dtype)


def emulate_online(q, k, v, scale, dtype, tile=128, rounded_sums=False):
    """The same with an online softmax over key tiles: P rounded against the running row max;
    with rounded_sums, the row sums of that rounded P."""
    m = torch.full(q.shape[:-1] + (1,), -torch.inf, dtype=q.dtype, device=q.device)
    acc, rowsum = 0.0, 0.0
    for j in range(0, k.shape[-2], tile):
        s = (q @ k[..., j:j + tile, :].transpose(-1, -2)) * scale
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new)   # 0 on the first tile (m = -inf)
        p = torch.exp(s - m_new)
        p_rounded = p.to(dtype).double()
        acc = acc * alpha + p_rounded @ v[..., j:j + tile, :]
        rowsum = rowsum * alpha + (p_rounded if rounded_sums else p).sum(-1, keepdim=True)
        m = m_new
    return (acc / rowsum).to(dtype)


def mean_rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().mean() / ref.abs().mean()).item()


STATS = {"max": rel_err, "mean": mean_rel_err}


def rows(B, H, N, dk, dv, dtype, device, seed, stat):
    gen = torch.Generator().manual_seed(seed)
    # Channel-first split views of one conv output, as the blocks hand them over.
    x = torch.randn(B, H * (2 * dk + dv), N, generator=gen).to(device, dtype)
    q, k, v = (t.transpose(2, 3) for t in x.view(B, H, 2 * dk + dv, N).split([dk, dk, dv], 2))
    scale = dk ** -0.5
    q64, k64, v64 = (t.double() for t in (q, k, v))
    ref = torch.softmax((q64 @ k64.transpose(-1, -2)) * scale, -1) @ v64
    out = {"exact, rounded once": ref.to(dtype),
           "P rounded": emulate(q64, k64, v64, scale, dtype),
           "P rounded, online": emulate_online(q64, k64, v64, scale, dtype),
           "P rounded, online, rounded sums": emulate_online(q64, k64, v64, scale, dtype,
                                                             rounded_sums=True),
           "P rounded, lazy max": emulate(q64, k64, v64, scale, dtype, lazy_keys=64)}
    runs = {"ours (auto)": ({}, "auto"), "ours, reference kernel": ({}, "reference")}
    if device == "cuda":
        runs["ours, mma.sync (no_sm90)"] = ({"no_sm90": True}, "auto")
        if torch.cuda.get_device_capability() == (9, 0):
            for wg in (2, 3):
                runs[f"ours, K / V tile images, {wg} warpgroups"] = (
                    {"kv_images": "always", "kv_image_warpgroups": wg}, "auto")
    for name, (overrides, impl) in runs.items():
        ctx = _testing.force(**overrides) if overrides else contextlib.nullcontext()
        with ctx:
            out[name] = torch.ops.psa_fa2.fwd(q, k, v, scale, impl)[0]
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = {"SDPA cuDNN": SDPBackend.CUDNN_ATTENTION, "SDPA flash": SDPBackend.FLASH_ATTENTION,
                    "SDPA mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
        for name, backend in backends.items():
            try:
                with sdpa_kernel(backend):
                    out[name] = torch.nn.functional.scaled_dot_product_attention(
                        q.contiguous(), k.contiguous(), v.contiguous(), scale=scale)
            except RuntimeError as e:   # a backend that does not take these shapes
                print(f"  {name}: {str(e).splitlines()[0]}", file=sys.stderr)
    return {name: STATS[stat](x, ref) for name, x in out.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", nargs="+", default=["64x2x400", "16x8x400"], metavar="BxHxN")
    p.add_argument("--head-dims", nargs="+", default=["32x32", "32x64"], metavar="DKxDV")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16", "fp16"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--stat", choices=list(STATS), default="max",
                   help="max or mean |out - ref|, relative to the same of |ref|")
    args = p.parse_args()
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
          f"psa_fa2_ext {psa_fa2_ext.build_info()['version']}; output error ({args.stat}), "
          f"range over {args.seeds} seeds\n")
    print("| dtype | dk×dv | B×H×N | source | err out | / P rounded |\n|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        for dims in args.head_dims:
            dk, dv = map(int, dims.split("x"))
            for shape in args.shapes:
                B, H, N = map(int, shape.split("x"))
                errs, ratios = {}, {}
                for seed in range(args.seeds):
                    r = rows(B, H, N, dk, dv, DTYPES[dtype], args.device, seed, args.stat)
                    for name, e in r.items():
                        errs.setdefault(name, []).append(e)
                        ratios.setdefault(name, []).append(e / r["P rounded"])
                for name, e in errs.items():
                    print(f"| {dtype} | {dims} | {shape} | {name} | {min(e):.3e}-{max(e):.3e} | "
                          f"{min(ratios[name]):.3f}-{max(ratios[name]):.3f} |")


if __name__ == "__main__":
    main()
