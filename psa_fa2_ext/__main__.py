"""`python -m psa_fa2_ext`: what was built, and what this machine can run.

`python -m psa_fa2_ext --plan B H N DK DV DTYPE LAYOUT [--device NAME]`: which kernels and
copies a CUDA call of that shape runs (forward and backward), on the visible GPU or on a named
one, without running it.
"""
import argparse

import torch

import psa_fa2_ext
from psa_fa2_ext import _plan


def runs_on_current_gpu() -> str:
    """One tiny forward: the ops raise, naming what is missing, on a GPU this build has no
    code for."""
    q = torch.zeros(1, 1, 1, 16, device="cuda", dtype=torch.float16)
    try:
        torch.ops.psa_fa2.fwd(q, q, q, 1.0)
        torch.cuda.synchronize()
    except RuntimeError as error:
        return f"cannot run the kernels: {str(error).splitlines()[0]}"
    return "runs the kernels"


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
                           args.plan[6])
    print(f"{name}, B H N = {b} {h} {n}, dk dv = {dk} {dv}, {args.plan[5]}, {args.plan[6]}")
    for direction in ("fwd", "bwd"):
        description, _ = _plan.plan(direction, q, k, v, device=device,
                                    deterministic=args.deterministic)
        print(f"  {direction}: {description}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m psa_fa2_ext", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", nargs=7, metavar=("B", "H", "N", "DK", "DV", "DTYPE", "LAYOUT"),
                        help=f"DTYPE one of {', '.join(_plan.DTYPES)}, LAYOUT one of "
                             f"{', '.join(_plan.LAYOUTS)}")
    parser.add_argument("--device", choices=sorted(_plan.DEVICES),
                        help="plan for this GPU instead of the visible one")
    parser.add_argument("--deterministic", action="store_true", help="plan a deterministic backward")
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
            print(f"  {runs_on_current_gpu()}")
    else:
        print("GPU: none visible")


if __name__ == "__main__":
    main()
