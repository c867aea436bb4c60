#!/usr/bin/env python3
"""Compile-only smoke for the fast forward kernels (no GPU needed).

Compiles flash_fwd_*.cu instantiations with nvcc for each architecture, prints ptxas registers
and spills, and fails when an instantiation spills or (if cuobjdump is on PATH) contains no
tensor-core HMMA instruction.

  python csrc/cuda/check_flash_fwd_build.py              # (32, 64), bf16 + fp16, both layouts
  python csrc/cuda/check_flash_fwd_build.py --all        # every generated instantiation
  python csrc/cuda/check_flash_fwd_build.py --arch 90 flash_fwd_bf16_32x64_cf.cu
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def compile_one(src, arch, nvcc, workdir):
    obj = pathlib.Path(workdir) / f"{src.stem}_sm{arch}.o"
    cmd = [nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", "-Xptxas", "-v", "-c", str(src),
           "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return None, res.stderr
    log = res.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    info = {
        "regs": int(regs.group(1)) if regs else -1,
        "spill_st": int(spill.group(1)) if spill else -1,
        "spill_ld": int(spill.group(2)) if spill else -1,
        "hmma": None,
    }
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "--dump-sass", str(obj)], capture_output=True,
                              text=True).stdout
        info["hmma"] = sass.count("HMMA")
    return info, log


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="*", help="instantiation .cu names (default: the 32x64 ones)")
    ap.add_argument("--all", action="store_true", help="check every generated instantiation")
    ap.add_argument("--arch", action="append", help="SM architecture, e.g. 80 (repeatable)")
    args = ap.parse_args()

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("nvcc not found on PATH")
        return 2
    archs = args.arch or ["80", "90"]
    if args.files:
        srcs = [HERE / f for f in args.files]
    elif args.all:
        srcs = sorted(p for p in HERE.glob("flash_fwd_*.cu")
                      if re.fullmatch(r"flash_fwd_[a-z0-9]+_\d+x\d+_[a-z]+\.cu", p.name))
    else:
        srcs = sorted(HERE.glob("flash_fwd_*_32x64_*.cu"))
    if not srcs:
        print("no instantiations found: run generate_flash_fwd.py")
        return 2

    failed = 0
    with tempfile.TemporaryDirectory() as work:
        for src in srcs:
            for arch in archs:
                info, log = compile_one(src, arch, nvcc, work)
                if info is None:
                    print(f"FAIL sm_{arch} {src.name}: compile error\n{log}")
                    failed += 1
                    continue
                bad = info["spill_st"] != 0 or info["spill_ld"] != 0 or info["hmma"] == 0
                failed += bad
                hmma = "n/a (no cuobjdump)" if info["hmma"] is None else info["hmma"]
                print(f"{'FAIL' if bad else 'ok  '} sm_{arch} {src.name}: {info['regs']} registers, "
                      f"spill stores {info['spill_st']} B, spill loads {info['spill_ld']} B, "
                      f"HMMA {hmma}")
    print(f"{len(srcs) * len(archs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
