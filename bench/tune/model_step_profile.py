"""Where a model's AMP training step spends its GPU time, Ultralytics' attention against ours:

    python bench/tune/model_step_profile.py [--models yolo12n yolo12s] [--imgsz 640] [--batch 16]

The step is bench_model.py's (fake batch, channels_last, fp16 autocast, loss, backward, SGD).
Per step: the wall time between CUDA events, the device kernels' summed time (busy: below the
wall time where the GPU waits for the host), and the time of our op's kernels. The rest of
the model is the same in both runs, so the eager attention's own kernels (its matmuls,
softmax and layout copies) take about eager busy - patched busy + ours; bench_model.py's
"attn" columns time whole blocks alone (their convolutions and host launches included).
The largest kernels of each run follow.
"""
import argparse
import collections
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import bench_model  # noqa: E402
from timing import DEVICE_WORK  # noqa: E402

STEPS = 5


def profile_step(step):
    """(wall ms, busy ms, our kernels' ms, {kernel name: ms}) per step, over STEPS steps."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            walls.append(start.elapsed_time(end))
    by_name = collections.Counter()
    for e in prof.events():
        kind = getattr(e, "activity_type", None)   # as timing.kernel_time counts device work
        if (e.device_type != torch.autograd.DeviceType.CPU and (kind is None or kind in DEVICE_WORK)
                and not getattr(e, "is_user_annotation", False)):
            by_name[e.name] += e.time_range.elapsed_us() / 1e3 / STEPS
    ours = sum(ms for name, ms in by_name.items() if "psa_fa2" in name)
    return statistics.median(walls), sum(by_name.values()), ours, by_name


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["yolo12n", "yolo12s"])
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("model_step_profile.py needs a CUDA GPU")
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, AMP training step, {args.imgsz} px, batch {args.batch},"
          f" ms per step (median wall of {STEPS}; kernel sums over them)")
    print("| model | attention | wall ms | busy ms | busy / wall | our kernels ms |")
    print("|---|---|---|---|---|---|")
    tops = {}
    for name in args.models:
        base = bench_model.build_model(bench_model.model_name(name))
        busy = {}
        for mode in bench_model.MODES:
            _, step = bench_model.train_step(base, mode, args.imgsz, args.batch, device, amp=True)
            wall, busy[mode], ours, by_name = profile_step(step)
            tops[name, mode] = by_name.most_common(args.top)
            print(f"| {name} | {mode} | {wall:.1f} | {busy[mode]:.1f} | {busy[mode] / wall:.2f} |"
                  f" {ours:.2f} |")
        print(f"| {name} | eager attention's kernels (derived) | | "
              f"{busy['eager'] - busy['psa_fa2'] + ours:.2f} | | |")
    for (name, mode), top in tops.items():
        print(f"\n{name}, {mode}: largest kernels, ms per step")
        for kernel, ms in top:
            print(f"  {ms:8.3f}  {kernel[:120]}")


if __name__ == "__main__":
    main()
