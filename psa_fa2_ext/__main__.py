"""`python -m psa_fa2_ext`: what was built, and what this machine can run.

`python -m psa_fa2_ext --plan B H N DK DV DTYPE LAYOUT [--device NAME] [--area A]`: which kernels and
copies a CUDA call of that shape runs (forward and backward), on the visible GPU or on a named
one, without running it.
"""
import argparse

import torch

import psa_fa2_ext
from psa_fa2_ext import _plan


# What `python -m psa_fa2_ext` shows for the visible GPU: the Ultralytics blocks' head dims and
# the common square ones, at 400 tokens on the block's views.
SUMMARY_CASES = [(32, 64), (32, 32), (64, 64), (128, 128), (48, 48)]


def print_gpu_paths(device) -> None:
    """Which kernel each dtype and head dims take on the visible GPU (forward / backward)."""
    if not device[5]:
        print("  runs none of this build's kernels: every call runs blockwise on at::matmul "
              "(the first call's warning says why and how to build for it)")
        return
    for dk, dv in SUMMARY_CASES:
        for dtype in ("bf16", "fp16", "fp32"):
            q, k, v = _plan.inputs(16, 4, 400, dk, dv, _plan.DTYPES[dtype], "psa")
            fwd = _plan.plan("fwd", q, k, v, device=device)[0].split(";")[0]
            bwd = _plan.plan("bwd", q, k, v, device=device)[0].split(";")[0]
            print(f"  {dk}x{dv} {dtype}: {fwd} | {bwd}")


def print_plans(args) -> None:
    if args.device:
        device, name = _plan.DEVICES[args.device], args.device
    elif torch.cuda.is_available():
        device, name = _plan.current_device(), torch.cuda.get_device_name()
    else:
        raise SystemExit("--plan: no GPU visible; name one with --device "
                         f"({', '.join(_plan.DEVICES)})")
    b, h, n, dk, dv = args.plan[:5]
    q, k, v = _plan.inputs(int(b), int(h), int(n), int(dk), int(dv), _plan.DTYPES[args.plan[5]],
                           args.plan[6], area=args.area)
    area = f", area {args.area}" if args.area > 1 else ""
    print(f"{name}, B H N = {b} {h} {n}, dk dv = {dk} {dv}, {args.plan[5]}, {args.plan[6]}{area}")
    for direction in ("fwd", "bwd"):
        description, _ = _plan.plan(direction, q, k, v, device=device,
                                    deterministic=args.deterministic, area=args.area)
        print(f"  {direction}: {description}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m psa_fa2_ext", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", nargs=7, metavar=("B", "H", "N", "DK", "DV", "DTYPE", "LAYOUT"),
                        help=f"DTYPE one of {', '.join(_plan.DTYPES)}, LAYOUT one of "
                             f"{', '.join(_plan.LAYOUTS)}")
    parser.add_argument("--device", choices=sorted(_plan.DEVICES),
                        help="plan for this GPU instead of the visible one")
    parser.add_argument("--deterministic", action="store_true", help="plan a deterministic backward")
    parser.add_argument("--area", type=int, default=1,
                        help="psa_attention's area (YOLO12's area attention; layout psa)")
    args = parser.parse_args()
    if args.plan:
        print_plans(args)
        return
    info = psa_fa2_ext.build_info()
    print(f"psa_fa2_ext {info['version']}")
    print(f"built against torch {info['torch_version']}; running torch {torch.__version__}")
    print(f"CPU kernels: fused tiles, {info['cpu_isa']} code on this CPU "
          f"({torch.get_num_threads()} threads)")
    if info["cuda"]:
        print(f"CUDA kernels: built with CUDA {info['cuda_version']} for archs {info['cuda_archs']}")
        print(f"  kernels: {', '.join(info['cuda_kernels'])}")
    else:
        print("CUDA kernels: not built (CPU-only build)")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{major}{minor})")
        if info["cuda"]:
            print_gpu_paths(_plan.current_device())
    else:
        print("GPU: none visible")


if __name__ == "__main__":
    main()
