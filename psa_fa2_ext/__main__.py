"""`python -m psa_fa2_ext`: what was built, and what this machine can run."""
import torch

import psa_fa2_ext


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


def main() -> None:
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
