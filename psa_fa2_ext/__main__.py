"""`python -m psa_fa2_ext`: what was built, and what this machine can run."""
import torch

import psa_fa2_ext


def main() -> None:
    info = psa_fa2_ext.build_info()
    print(f"psa_fa2_ext {info['version']}")
    print(f"built against torch {info['torch_version']}; running torch {torch.__version__}")
    if info["cuda"]:
        print(f"CUDA kernels: built with CUDA {info['cuda_version']} for archs {info['cuda_archs']}")
        print(f"  kernels: {', '.join(info['cuda_kernels'])}")
    else:
        print("CUDA kernels: not built (CPU-only build)")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{major}{minor})")
    else:
        print("GPU: none visible")


if __name__ == "__main__":
    main()
