"""Our kernels' times in two sets of benchmark runs, row by row: the median over each set's
rounds and the ratio, for an A/B of two trees (before_after.sh, patch_ab.sh):

    python bench/tune/compare_runs.py --before b1.json b2.json --after a1.json a2.json

The .json files are bench/bench_attention.py's. Rows are matched by block, shape, area, head
dims, dtype and mode; the spread column is the largest ratio between one set's rounds, the
run-to-run noise a change must stand clear of.
"""
import argparse
import json
import statistics


def ours_times(paths):
    """{row key: [kernel us of each run]} of our rows with a time."""
    times = {}
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["rows"]
        for r in rows:
            if r["peer"] != "ours" or r["status"] != "ok" or r["kernel_us"] is None:
                continue
            key = (r.get("block", "psa"), r["dtype"], r["B"], r["H"], r["N"], r.get("area", 1), r["dk"],
                   r["dv"], r["mode"])
            times.setdefault(key, []).append(r["kernel_us"])
    return times


def spread(values):
    return max(values) / min(values) if len(values) > 1 else 1.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", nargs="+", required=True)
    p.add_argument("--after", nargs="+", required=True)
    args = p.parse_args()
    before, after = ours_times(args.before), ours_times(args.after)
    print("| block | dtype | B×H×N (area) | dk×dv | mode | before us | after us | after / before "
          "| spread |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for key in before:
        if key not in after:
            continue
        block, dtype, B, H, N, area, dk, dv, mode = key
        b, a = statistics.median(before[key]), statistics.median(after[key])
        ratios.append(a / b)
        shape = f"{B}×{H}×{N}" + (f" ({area})" if area != 1 else "")
        print(f"| {block} | {dtype} | {shape} | {dk}×{dv} | {mode} | {b:.1f} | {a:.1f} | "
              f"{a / b:.3f} | {max(spread(before[key]), spread(after[key])):.3f} |")
    if ratios:
        print(f"\n{len(ratios)} rows; after / before: geometric mean "
              f"{statistics.geometric_mean(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
