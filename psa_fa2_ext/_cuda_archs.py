"""Which CUDA archs the build compiles for (setup.py loads this file by path, before the
package exists; it imports nothing).

The kernels need compute capability 8.0 (cp.async, bf16 mma.sync): ptxas rejects them for
older targets, so an older arch in TORCH_CUDA_ARCH_LIST (a T4's 7.5, which is also what the
build picks by itself where a T4 is the visible GPU) would fail the whole build. Such archs are
left out, with a note; GPUs below 8.0 run the ops blockwise on at::matmul, which needs no code
of ours (docs/design.md).
"""

# Ampere (sm_80, the oldest we support; its SASS runs on every 8.x GPU) and Hopper (sm_90a),
# plus compute_80 PTX, which the driver compiles for the GPUs neither runs (Blackwell and
# later) on their first launch.
DEFAULT = "8.0+PTX;9.0a"
MIN_MAJOR = 8

# torch.utils.cpp_extension's names for arch groups (it expands them the same way).
NAMED = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
}


def supported(arch_list):
    """(the archs of `arch_list` (TORCH_CUDA_ARCH_LIST syntax) that the kernels support, joined
    by ';', or DEFAULT when none is; the archs left out). Entries that are not archs are kept
    as they are, for torch to reject with its own message."""
    entries = []
    for entry in arch_list.replace(" ", ";").split(";"):
        entries += NAMED.get(entry, entry).split(";")
    kept, dropped = [], []
    for entry in filter(None, entries):
        major = entry.split(".")[0]
        (dropped if major.isdigit() and int(major) < MIN_MAJOR else kept).append(entry)
    return (";".join(kept) if kept else DEFAULT), dropped


def for_gpu(major, minor):
    """As supported(), for a visible GPU of compute capability major.minor: its own arch
    (Hopper's 9.0 as 9.0a: the wgmma kernels are sm_90a code, which runs on compute capability
    9.0 only), or DEFAULT below 8.0."""
    return supported(f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else ""))
