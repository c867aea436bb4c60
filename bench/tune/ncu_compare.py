"""Side-by-side Nsight Compute figures of the Hopper forward and backward kernels of two
implementations, from the text reports of `ncu ... python bench/tune/profile_kernels.py`:

    python bench/tune/ncu_compare.py ncu_ours_1x2x62500.txt ncu_fa4_1x2x62500.txt \\
        --labels ours FA4

A report's kernel is the forward one when its name holds "fwd_sm90", the backward one when it
holds "bwd_sm90" but neither "preprocess" nor "postprocess" (our names and FlashAttention-4's
both do). Prints one markdown table per kernel kind, the figures as the reports give them.
"""
import argparse
import re

FIGURES = [
    ("Duration", "duration"),
    ("SM Frequency", "SM clock"),
    ("Block Size", "threads per CTA"),
    ("Grid Size", "CTAs"),
    ("Registers Per Thread", "registers per thread (at launch)"),
    ("Dynamic Shared Memory Per Block", "dynamic shared memory per CTA"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
    ("smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "XU (MUFU) pipe %"),
    ("smsp__inst_executed.sum", "warp instructions executed"),
    ("Issue Slots Busy", "issue slots busy %"),
    ("Warp Cycles Per Issued Instruction", "warp cycles per issued instruction"),
    ("Active Warps Per Scheduler", "active warps per scheduler"),
    ("Eligible Warps Per Scheduler", "eligible warps per scheduler"),
    ("No Eligible", "no eligible warp %"),
    ("L1/TEX Cache Throughput", "L1 / shared throughput %"),
    ("L2 Cache Throughput", "L2 throughput %"),
]
ROW = re.compile(r"^\s+(.+?)\s{2,}(\S+)?\s+([\d,.]+)\s*$")


def kind_of(name):
    if "fwd_sm90" in name:
        return "forward"
    if "bwd_sm90" in name and "preprocess" not in name and "postprocess" not in name:
        return "backward"
    return None


def kernels(path):
    """{kind: {figure: (value, unit)}} of the first kernel of each kind in a report."""
    found, current = {}, None
    for line in open(path, errors="replace"):
        if re.match(r"^  \S", line) and "Context" in line:
            kind = kind_of(line)
            current = {} if kind and kind not in found else None
            if current is not None:
                found[kind] = current
            continue
        m = ROW.match(line) if current is not None else None
        if m and m.group(1).strip() not in current:
            current[m.group(1).strip()] = (m.group(3), m.group(2) or "")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs=2)
    ap.add_argument("--labels", nargs=2, default=["first", "second"])
    args = ap.parse_args()
    a, b = (kernels(p) for p in args.reports)
    for kind in ("forward", "backward"):
        if kind not in a or kind not in b:
            continue
        print(f"\n{kind}\n\n| figure | {args.labels[0]} | {args.labels[1]} |\n|---|---|---|")
        for key, label in FIGURES:
            va, ua = a[kind].get(key, ("-", ""))
            vb, _ = b[kind].get(key, ("-", ""))
            unit = f" ({ua})" if key in ("Duration", "SM Frequency") else ""  # us or ms, GHz
            print(f"| {label}{unit} | {va} | {vb} |")


if __name__ == "__main__":
    main()
