"""Markdown kernel-time tables (one per mode) from bench_attention.py JSON files, for the
README: python bench/summary_table.py bench/results/<run>/h200-bf16.json [--dtype bf16]"""
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
    args = ap.parse_args()
    times, shapes = {}, set()
    for path in args.json:
        for r in json.load(open(path))["rows"]:
            # The README's table is PSA's; AAttn / AIFI rows have their own shapes.
            if r["dtype"] != args.dtype or r.get("block", "psa") != "psa":
                continue
            shapes.add((r["B"], r["H"], r["N"]))
            if r["status"] == "ok":
                times[(r["B"], r["H"], r["N"], r["mode"], r["peer"])] = r["kernel_us"]
    present = [(p, name) for p, name in PEERS if any(k[4] == p for k in times)]
    for mode in ("fwd", "fwd+bwd"):
        print(f"| {mode}: B, heads, N | " + " | ".join(name for _, name in present) +
              " | best peer / ours |")
        print("|---|" + "---|" * (len(present) + 1))
        for s in sorted(shapes, key=lambda s: (s[2], s[0] * s[1])):
            vals = [times.get(s + (mode, p)) for p, _ in present]
            peers = [v for v in vals[1:] if v is not None]
            ratio = f"{min(peers) / vals[0]:.2f}" if peers and vals[0] else "n/a"
            print(f"| {s[0]}, {s[1]}, {s[2]} | " + " | ".join(fmt(v) for v in vals) + f" | {ratio} |")
        print()


if __name__ == "__main__":
    main()
