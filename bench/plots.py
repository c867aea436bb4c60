"""PNG plots of the benchmark results (matplotlib, no display needed).

- ``plot_model_memory``: peak memory of model inference by image size, eager vs
  psa_fa2, from the JSON written by ``bench/bench_model.py``.
- ``plot_kernel_speedup``: kernel-level ratio by sequence length N, one line per
  (peer, dtype, pass), from the JSON written by ``bench/bench_attention.py``. That file
  is someone else's and may change shape, so the reader accepts several spellings of
  each field and skips rows it can't place rather than failing.

Command line: ``python bench/plots.py --model R.json [R2.json ...] --attention A.json --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; CI and the GPU box have no display
    import matplotlib.pyplot as plt

    return plt


# --- model level ---------------------------------------------------------------------


def plot_model_memory(results: dict, path: str | Path) -> Path | None:
    """Peak memory (MiB) of fp16 inference by image size; OOM runs drawn as crosses on top."""
    rows = [r for r in results.get("infer", []) if r.get("imgsz")]
    ok_peaks = [r["peak_mib"] for r in rows if r.get("status") == "ok" and r.get("peak_mib")]
    if not ok_peaks and not any(r.get("status") == "OOM" for r in rows):
        return None  # e.g. a CPU run: no allocator statistics to plot
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(ok_peaks) * 1.5 if ok_peaks else 1.0
    series = defaultdict(list)
    for r in rows:
        series[(r["model"], r["mode"])].append(r)
    colors = {}
    for (model, mode), rs in sorted(series.items()):
        rs.sort(key=lambda r: r["imgsz"])
        color = colors.setdefault(model, f"C{len(colors)}")
        style = "-" if mode == "psa_fa2" else "--"
        ok = [r for r in rs if r.get("status") == "ok" and r.get("peak_mib")]
        ax.plot(
            [r["imgsz"] for r in ok],
            [r["peak_mib"] for r in ok],
            style,
            marker="o",
            color=color,
            label=f"{model} {mode}",
        )
        oom = [r for r in rs if r.get("status") == "OOM"]
        if oom:
            ax.scatter([r["imgsz"] for r in oom], [top] * len(oom), marker="x", s=60, color=color)
    if any(r.get("status") == "OOM" for r in rows):
        ax.axhline(top, color="grey", lw=0.5)
        ax.text(0.01, top, "OOM", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8, color="grey")
    if ok_peaks:
        ax.set_yscale("log")
    ax.set_xscale("log")
    sizes = sorted({r["imgsz"] for r in rows})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("image size (px, square, batch 1)")
    ax.set_ylabel("peak allocated memory (MiB)")
    meta = results.get("meta", {})
    ax.set_title(f"Inference peak memory ({meta.get('infer_dtype', '')}, {meta.get('device', '')})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- kernel level --------------------------------------------------------------------

_N_KEYS = ("N", "n", "seqlen", "seq_len", "seqlen_q", "tokens")
_PEER_KEYS = ("peer", "baseline", "vs", "against", "backend")
_OURS_KEYS = ("kernel", "impl", "variant", "ours")
_DTYPE_KEYS = ("dtype", "precision")
_PASS_KEYS = ("pass", "direction", "mode", "op", "phase")
# bench_attention.py writes ``vs_ours`` = peer kernel time / ours (> 1: ours faster);
# the others are spellings an older or newer file might use.
_RATIO_KEYS = ("vs_ours", "speedup", "ratio", "speedup_vs_peer", "peer_over_ours")
_RATIO_MEANING = {"vs_ours": "peer kernel time / ours (> 1: ours faster)"}
_OURS_NAMES = {"ours", "psa_fa2"}  # its own rows: the ratio is 1 by definition


def _first(row: dict, keys):
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _name(row: dict, keys):
    """The first non-numeric value among ``keys`` (a numeric one is a time, not a name)."""
    for k in keys:
        v = row.get(k)
        if v is not None and not isinstance(v, (int, float, dict, list)):
            return str(v)
    return None


def _n_of(row: dict):
    n = _first(row, _N_KEYS)
    if n is not None:
        try:
            return int(n)
        except (TypeError, ValueError):
            pass
    shape = row.get("shape")
    if isinstance(shape, dict):
        return _n_of(shape)
    if isinstance(shape, (list, tuple)) and len(shape) >= 3:
        # (B, H, N) as in DESIGN.md; a 4-tuple is (B, H, N, D) or (B, H, D, N): take the
        # largest of the last two, as D is 32..128 and the benchmark's N are larger.
        return int(shape[2]) if len(shape) == 3 else int(max(shape[2], shape[3]))
    if isinstance(shape, str):
        m = re.search(r"\bN\s*=\s*(\d+)", shape)
        if m:
            return int(m.group(1))
        nums = [int(x) for x in re.findall(r"\d+", shape)]
        if len(nums) >= 3:
            return nums[2]
    return None


def _rows_of(data):
    """The list of row dicts, wherever the file keeps it."""
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        for key in ("rows", "results", "data", "records", "benchmarks"):
            if isinstance(data.get(key), list):
                return _rows_of(data[key])
        # {name: row} mapping
        vals = [v for v in data.values() if isinstance(v, dict)]
        if vals and all(_n_of(v) is not None for v in vals):
            return vals
    return []


def load_kernel_rows(path: str | Path) -> tuple[list[dict], str, int]:
    """``(points, ratio_field, skipped)``: points have N, ratio, and a series label."""
    rows = _rows_of(json.loads(Path(path).read_text()))
    # Head dims go into the label only when the file has more than one pair.
    dims = {(r.get("dk"), r.get("dv")) for r in rows}
    points, fields, skipped = [], set(), 0
    for r in rows:
        if r.get("status", "ok") != "ok" or _name(r, _PEER_KEYS) in _OURS_NAMES:
            continue
        n = _n_of(r)
        ratio, field = None, None
        for k in _RATIO_KEYS:
            if isinstance(r.get(k), (int, float)):
                ratio, field = float(r[k]), k
                break
        if ratio is None:  # derive from two times if the row has them
            ours = _first(r, ("ours_ms", "ours_us", "time_ours"))
            peer = _first(r, ("peer_ms", "peer_us", "time_peer", "baseline_ms", "baseline_us"))
            if isinstance(ours, (int, float)) and isinstance(peer, (int, float)) and ours > 0:
                ratio, field = peer / ours, "peer time / our time"
        if n is None or ratio is None or ratio <= 0:
            skipped += 1
            continue
        fields.add(_RATIO_MEANING.get(field, field))
        parts = [_name(r, k) for k in (_OURS_KEYS, _PEER_KEYS, _DTYPE_KEYS, _PASS_KEYS)]
        if len(dims) > 1 and r.get("dk") is not None:
            parts.append(f"dk{r['dk']}/dv{r.get('dv')}")
        points.append({"N": n, "ratio": ratio, "label": " ".join(p for p in parts if p) or "all"})
    return points, " / ".join(sorted(fields)), skipped


def plot_kernel_speedup(attention_json: str | Path, path: str | Path) -> Path | None:
    """Ratio by N from bench_attention.py's JSON, log-log; None when no row is usable."""
    points, field, skipped = load_kernel_rows(attention_json)
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = defaultdict(lambda: defaultdict(list))
    for p in points:
        series[p["label"]][p["N"]].append(p["ratio"])
    several = False
    for label, by_n in sorted(series.items()):
        ns = sorted(by_n)
        # Several batch sizes at one N: draw each, join their geometric mean.
        several |= any(len(by_n[n]) > 1 for n in ns)
        line = ax.plot(ns, [math.prod(by_n[n]) ** (1 / len(by_n[n])) for n in ns], marker="o", label=label)
        for n in ns:
            if len(by_n[n]) > 1:
                ax.scatter([n] * len(by_n[n]), by_n[n], s=10, color=line[0].get_color(), alpha=0.5)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ns = sorted({p["N"] for p in points})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("N (tokens per head)")
    ax.set_ylabel(field, fontsize=9)
    title = f"psa_fa2 kernels vs peers ({Path(attention_json).name})"
    if several:
        title += "\nline: geometric mean over batch sizes, dots: each"
    if skipped:
        title += f" ({skipped} rows without N or ratio left out)"
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", help="JSON from bench/bench_model.py (several: one plot)")
    ap.add_argument("--attention", help="JSON from bench/bench_attention.py")
    ap.add_argument("--out", default="bench/results", help="folder for the PNGs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model:
        runs = [json.loads(Path(f).read_text()) for f in args.model]
        merged = {"meta": runs[0]["meta"], "infer": [r for run in runs for r in run.get("infer", [])]}
        print(plot_model_memory(merged, out / "model_memory.png"))
    if args.attention:
        print(plot_kernel_speedup(args.attention, out / "kernel_speedup.png"))


if __name__ == "__main__":
    main()
