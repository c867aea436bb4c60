"""Machine facts, JSON and markdown for the benchmark's results."""
import datetime
import json
import os
import platform
import subprocess

import torch

from layouts import LABELS
from peers import OURS, PEERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine(device):
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        # A copy of the tree shipped to a GPU host may carry no .git, or a stale one: there
        # PSA_FA2_COMMIT names the commit, and wins over what git says.
        "commit": os.environ.get("PSA_FA2_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": (None if os.environ.get("PSA_FA2_COMMIT") or not _git("rev-parse", "HEAD")
                  else bool(_git("status", "--porcelain"))),
        "device": str(device),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                    sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}")
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    try:
        import psa_fa2_ext
        info["psa_fa2_ext_file"] = psa_fa2_ext.__file__
        info["psa_fa2_ext_build"] = psa_fa2_ext.build_info()
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        info["psa_fa2_ext_error"] = f"{type(e).__name__}: {e}"
    return info


def summarise(rows):
    """Per (dtype, case, mode): ours, the fastest other peer, peer time / ours, and the peak
    memory of ours and of the eager block."""
    out, groups = [], {}
    for r in rows:
        groups.setdefault(_case_key(r), []).append(r)
    for key, rs in groups.items():
        ok = {r["peer"]: r for r in rs if r["status"] == "ok"}
        others = [r for r in ok.values() if r["peer"] not in OURS]
        best = min(others, key=lambda r: r["kernel_us"]) if others else None
        ours, seed = ok.get("ours"), ok.get("seed")
        eager = next((r for r in rs if r["peer"] == "eager"), None)
        s = dict(zip(("mode", "block", "B", "H", "N", "area", "dk", "dv", "dtype"), key))
        s.update(ours_us=ours and ours["kernel_us"],
                 best_peer=best and best["peer"], best_peer_us=best and best["kernel_us"],
                 seed_us=seed and seed["kernel_us"],
                 ours_peak_mb=ours and ours["peak_mb"],
                 eager_peak_mb=eager and (eager["peak_mb"] if eager["status"] == "ok"
                                          else eager.get("predicted_peak_mb")),
                 eager_peak_predicted=bool(eager) and eager["status"] != "ok")
        s["best_over_ours"] = (best["kernel_us"] / ours["kernel_us"]) if best and ours else None
        s["seed_over_ours"] = (seed["kernel_us"] / ours["kernel_us"]) if seed and ours else None
        out.append(s)
    return out


def _case_key(r):
    return (r["mode"], r.get("block", "psa"), r["B"], r["H"], r["N"], r.get("area", 1), r["dk"],
            r["dv"], r["dtype"])


def write(prefix, meta, config, rows, steps):
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    doc = {"meta": meta, "config": config, "rows": rows, "summary": summarise(rows),
           "eager_step": steps}
    with open(prefix + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = markdown(doc)
    with open(prefix + ".md", "w") as f:
        f.write(md)
    return md


def _f(x, spec):
    return "–" if x is None else format(x, spec)


def _us(x):
    if x is None:
        return "–"
    return f"{x:.1f}" if x < 1e4 else f"{x:,.0f}"


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


def shape_label(r):
    """B×H×N; AAttn with an area also as its attention calls (B·area × H × N/area), as the
    issue counts them; the block's name and head dims where they are not PSA's."""
    block, area = r.get("block", "psa"), r.get("area", 1)
    s = f"{r['B']}×{r['H']}×{r['N']}"
    if area > 1:
        s += f" area {area} = {r['B'] * area}×{r['H']}×{r['N'] // area}"
    if block != "psa":
        s = f"{LABELS[block]} {s}"
    default = (32, 64) if block == "psa" else (32, 32)
    return s if (r["dk"], r["dv"]) == default else f"{s} (dk {r['dk']}, dv {r['dv']})"


def reference_label(r):
    """The key of a case's reference time in config['reference_s']."""
    block, area = r.get("block", "psa"), r.get("area", 1)
    prefix = "" if block == "psa" else f"{block} "
    suffix = f" area {area}" if area > 1 else ""
    return f"{prefix}{r['dtype']} {r['B']}x{r['H']}x{r['N']}{suffix} {r['dk']}x{r['dv']}"



def markdown(doc):
    m, cfg = doc["meta"], doc["config"]
    where = m.get("gpu") or m.get("cpu")
    cpu = not m.get("gpu")
    peak_label = "peak RSS MB" if cpu else "peak MB"
    parts = [
        f"# psa_fa2_ext attention benchmark — {where}",
        f"{m['date']} · torch {m['torch']} (CUDA {m['torch_cuda']}, cuDNN {m['cudnn']}) · "
        f"commit {m['commit'] or 'none'}{' (dirty)' if m.get('dirty') else ''} · host {m['host']}",
        "",
        f"- kernel time: {cfg['kernel_method']}. Up to {cfg['warmup']} warm-up calls per row "
        "first." + ("" if cpu else " wall time: host perf_counter around a synchronised loop "
                    "of eager calls (launch and Python overhead included: what an eager user "
                    "waits for), median of up to 3 loops."),
        "- TFLOP/s from kernel time; fwd = 2·B·H·N²·(dk+dv) flops, fwd+bwd = 3.5× fwd.",
        f"- peer/ours = peer kernel time / ours (> 1: ours is faster). {peak_label} = "
        + cfg.get("peak_memory_method", "max_memory_allocated during one call minus what was "
                                        "allocated before it (inputs)") + ".",
        f"- error = max|x − ref| / max|ref| against {cfg['reference']}.",
        "- every peer starts from the same channel-first split views and returns "
        "[B, H, dv, N] contiguous; its layout copies and padding are in its time. fwd+bwd "
        "differentiates the qkv tensor the views were split from (as training does), so a "
        "peer also pays autograd's copy of the three view gradients into its gradient.",
    ]
    blocks = {r.get("block", "psa") for r in doc["rows"]}
    if "aattn" in blocks:
        parts.append("- AAttn (YOLO12): the same views of its qkv conv output, head dim 32; with "
                     "an area the attention is within each of `area` runs of N (shape: B×H×N, "
                     "then its attention calls B·area × H × N/area). Eager is Ultralytics' "
                     "AAttn from the conv output (its reshape to [B·area, N/area, 3C] and the "
                     "copies back); ours reads the views in place; the other peers copy each "
                     "area to a batch entry, [B·area, H, N/area, 32], and back. The copy of v "
                     "the block makes for its pe conv is in no peer's time.")
    if "aifi" in blocks:
        parts.append("- AIFI (RT-DETR): q, k, v are its three [B, N, C] in-projections viewed "
                     "as heads [B, H, N, 32] (token-major); every peer returns [B, N, C] "
                     "contiguous, what the out-projection reads; fwd+bwd differentiates the "
                     "three projections. Eager is nn.MultiheadAttention's math (bmm, softmax, "
                     "bmm, and the head-averaged weights it returns).")
    if m.get("psa_fa2_ext_error"):
        parts.append(f"- psa_fa2_ext could not be imported: {m['psa_fa2_ext_error']}")
    if cfg.get("planning"):
        parts.append(f"- {cfg['planning']}; budget: "
                     + (f"{cfg['budget_s']:g} s" if cfg.get("budget_s") else "none") + ".")
    if cfg.get("elapsed_s") is not None:
        parts.append(f"- run time {cfg['elapsed_s']:g} s (import excluded).")
    if cfg.get("stopped_early"):
        parts.append(f"- stopped early: {cfg['stopped_early']}")
    for mode in cfg["modes"]:
        rows = [r for r in doc["rows"] if r["mode"] == mode]
        if not rows:
            continue
        grads = mode != "fwd"
        wall = any(r["wall_us"] is not None for r in rows)   # none on a CPU: one clock
        header = (["shape", "dtype", "peer", "kernel us", "timing"] + (["wall us"] if wall else [])
                  + ["TFLOP/s", "peer/ours", peak_label, "err out"]
                  + (["err dq", "err dk", "err dv"] if grads else []) + ["note"])
        lines = []
        for r in rows:
            ok = r["status"] == "ok"
            errs = [r["err_out"]] + ([r["err_dq"], r["err_dk"], r["err_dv"]] if grads else [])
            note = r["note"] if ok else f"**{r['status']}** {r['note']}".strip()
            lines.append([shape_label(r), r["dtype"], PEERS[r["peer"]][0], _us(r["kernel_us"]),
                          r.get("kernel_method") or "–"] + ([_us(r["wall_us"])] if wall else [])
                         + [_f(r["tflops"], ".3g"), _f(r["vs_ours"], ".2f"),
                            _mb(r["peak_mb"]), *[_f(e, ".1e") for e in errs], note])
        parts += ["", f"## {mode}", "", _table(header, lines)]
    if doc["eager_step"]:
        lines = [[shape_label(s), s["dtype"], _us(s["ours_us"]), _us(s["sdpa_us"]), _us(s["eager_us"]),
                  _f(s["sdpa_over_ours"], ".2f"), _ratio_range(s.get("sdpa_over_ours_rounds")),
                  _f(s["eager_over_ours"], ".2f"), s["note"]]
                 for s in doc["eager_step"]]
        parts += ["", "## eager training step (wall clock)", "",
                  "qkv leaf → split views → attention → `out.backward(dout)` → qkv.grad, "
                  "per step, synchronised loop; SDPA auto pays its layout copies. The three "
                  "take turns, round by round; a time is the median over the rounds, and "
                  "'by round' the range of each round's own SDPA / ours.", "",
                  _table(["shape", "dtype", "ours us", "SDPA auto us", "eager us",
                          "SDPA/ours", "by round", "eager/ours", "note"], lines)]
    if any("cost_s" in r for r in doc["rows"]):
        parts += ["", costs(doc["rows"], cfg.get("reference_s") or {})]
    parts += ["", short(doc["summary"])]
    return "\n".join(parts) + "\n"


def _ratio_range(ratios):
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "–"


def costs(rows, reference_s):
    """Seconds per case: its rows, its reference, and what its skipped rows would have taken."""
    groups = {}
    for r in rows:
        groups.setdefault(reference_label(r), []).append(r)
    lines = []
    for key, rs in groups.items():
        ran = [r for r in rs if r["status"] != "skipped"]
        skipped = [r for r in rs if r["status"] == "skipped"]
        pred = [r["predicted_row_s"] for r in skipped if r.get("predicted_row_s")]
        by_mode = {m: sum(r.get("cost_s") or 0 for r in ran if r["mode"] == m)
                   for m in dict.fromkeys(r["mode"] for r in rs)}
        lines.append([rs[0]["dtype"], shape_label(rs[0]),
                      " · ".join(f"{m} {t:.1f}" for m, t in by_mode.items()),
                      _ref_s(reference_s.get(key)),
                      f"{len(skipped)}" + (f" (~{sum(pred):.0f} s)" if pred else "")])
    return ("## cost: seconds each case took\n\nrows: every call of the run's rows, probes "
            "included; reference: computed once per shape (a later dtype reuses it); skipped: "
            "rows not run and the seconds predicted for them.\n\n"
            + _table(["dtype", "shape", "rows s", "reference s", "skipped rows"], lines))


def _ref_s(x):
    return x if isinstance(x, str) else _f(x, ".1f")


def _mb(x):
    if x is None:
        return "–"
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def short(summary):
    seed = any(s["seed_us"] for s in summary)
    lines = []
    for s in summary:
        eager = _mb(s["eager_peak_mb"])
        if s["eager_peak_mb"] is not None and s["eager_peak_predicted"]:
            eager = f"~{eager} (skipped)"
        ratio = (s["eager_peak_mb"] / s["ours_peak_mb"]
                 if s["eager_peak_mb"] and s["ours_peak_mb"] and not s["eager_peak_predicted"] else None)
        lines.append([s["dtype"], shape_label(s), s["mode"], _us(s["ours_us"]), f"{s['best_peer'] or '–'}",
                      _us(s["best_peer_us"]), _f(s["best_over_ours"], ".2f")]
                     + ([_f(s["seed_over_ours"], ".1f")] if seed else [])
                     + [_mb(s["ours_peak_mb"]), eager, _f(ratio, ".3g")])
    header = (["dtype", "shape", "mode", "ours us", "best peer", "peer us", "peer/ours"]
              + (["seed/ours"] if seed else []) + ["ours peak MB", "eager peak MB", "eager/ours peak"])
    return ("## summary: kernel time, ours vs the fastest peer; peak memory, ours vs eager\n\n"
            "peer/ours > 1: ours is faster. ~: the eager row was skipped; its predicted peak.\n\n"
            + _table(header, lines))


def merge(paths, prefix):
    """One report from several runs of one machine (e.g. a full matrix split by dtype to fit
    a time limit): rows and eager-step rows are concatenated, meta is the first run's."""
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append(json.load(f))
    cfg = dict(docs[0]["config"])
    for key in ("blocks", "dtypes", "peers", "modes"):
        cfg[key] = list(dict.fromkeys(x for d in docs for x in d["config"].get(key, ["psa"])))
    # Shapes per block; runs from before the AAttn / AIFI blocks list PSA shapes alone.
    shapes = {}
    for d in docs:
        by_block = d["config"]["shapes"]
        for block, ss in (by_block if isinstance(by_block, dict) else {"psa": by_block}).items():
            shapes[block] = list(dict.fromkeys(tuple(s) for s in shapes.get(block, []) + ss))
    cfg["shapes"] = shapes
    cfg["merged_from"] = [os.path.abspath(p) for p in paths]
    cfg["stopped_early"] = "; ".join(filter(None, (d["config"].get("stopped_early") for d in docs))) or None
    rows = [r for d in docs for r in d["rows"]]
    steps = [s for d in docs for s in d["eager_step"]]
    return write(prefix, docs[0]["meta"], cfg, rows, steps)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="merge benchmark JSON files into one report")
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", required=True, help="path prefix for the merged .json/.md")
    a = ap.parse_args()
    print(merge(a.json, os.path.splitext(a.out)[0] if a.out.endswith((".json", ".md")) else a.out))
