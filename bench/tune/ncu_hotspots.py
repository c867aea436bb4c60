"""The SASS instructions where a kernel's warps wait most, from Nsight Compute's source page:

    ncu -k regex:KERNEL -c 1 --section SourceCounters -o report python script.py
    ncu --import report.ncu-rep --page source --csv --print-source sass > sass.csv
    python bench/tune/ncu_hotspots.py sass.csv [--top 40]

Prints the total of the warp-state samples, then per instruction (hottest first) its index in
the kernel, its samples, its executions and the stall reasons that hold its samples.
"""
import argparse
import csv

REASONS = ["stall_short_sb", "stall_wait", "stall_barrier", "stall_long_sb", "stall_mio",
           "stall_math", "stall_branch_resolving", "stall_not_selected", "stall_selected"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header_at = next(i for i, r in enumerate(rows) if "# Samples" in r)
    col = {name: i for i, name in enumerate(rows[header_at])}
    body = [r for r in rows[header_at + 1:] if len(r) == len(rows[header_at])]
    samples = lambda r: int(r[col["# Samples"]])  # noqa: E731
    print(f"{sum(map(samples, body))} samples over {len(body)} instructions")
    print("| index | samples | executed | instruction | stalls |")
    print("|---|---|---|---|---|")
    order = sorted(range(len(body)), key=lambda i: -samples(body[i]))
    for i in order[:args.top]:
        r = body[i]
        stalls = ", ".join(f"{name[6:]} {r[col[name]]}" for name in REASONS
                           if name in col and r[col[name]] not in ("0", ""))
        print(f"| {i} | {samples(r)} | {r[col['Instructions Executed']]} | "
              f"`{r[col['Source']].strip()}` | {stalls} |")


if __name__ == "__main__":
    main()
