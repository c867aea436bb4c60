"""Markdown kernel-time tables (one per mode) from bench_attention.py JSON files, for the
README: python bench/summary_table.py bench/results/<run>/h200-bf16.json [--dtype bf16]
[--block psa|aattn|aifi] (AAttn shapes: B, heads, N of the block, then its area)."""
import argparse
import json

PEERS = [("ours", "ours"), ("sdpa_cudnn", "cuDNN"), ("sdpa_efficient", "mem-eff"),
         ("sdpa_flash", "flash (padded)"), ("flex", "Flex"), ("fa4", "FA4"), ("eager", "eager")]


def fmt(us):
    return "n/a" if us is None else (f"{us:,.0f}" if us >= 100 else f"{us:.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--block", default="psa", choices=("psa", "aattn", "aifi"))
    args = ap.parse_args()
    times, shapes = {}, set()
    for path in args.json:
        for r in json.load(open(path))["rows"]:
            if r["dtype"] != args.dtype or r.get("block", "psa") != args.block:
                continue
            shape = (r["B"], r["H"], r["N"], r.get("area", 1))
            shapes.add(shape)
            if r["status"] == "ok":
                times[shape + (r["mode"], r["peer"])] = r["kernel_us"]
    present = [(p, name) for p, name in PEERS if any(k[-1] == p for k in times)]
    if args.block != "psa":   # dk == dv: SDPA flash runs them as they are
        present = [(p, "flash" if p == "sdpa_flash" else name) for p, name in present]
    for mode in ("fwd", "fwd+bwd"):
        head = "B, heads, N (area)" if args.block == "aattn" else "B, heads, N"
        print(f"| {mode}: {head} | " + " | ".join(name for _, name in present) +
              " | best peer / ours |")
        print("|---|" + "---|" * (len(present) + 1))
        # By the attention's own N (N / area), then by its batch x heads.
        for s in sorted(shapes, key=lambda s: (s[2] // s[3], s[0] * s[1] * s[3])):
            vals = [times.get(s + (mode, p)) for p, _ in present]
            peers = [v for v in vals[1:] if v is not None]
            ratio = f"{min(peers) / vals[0]:.2f}" if peers and vals[0] else "n/a"
            area = f" ({s[3]})" if s[3] > 1 else ""
            print(f"| {s[0]}, {s[1]}, {s[2]}{area} | " + " | ".join(fmt(v) for v in vals) +
                  f" | {ratio} |")
        print()


if __name__ == "__main__":
    main()
