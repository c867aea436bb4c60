"""The instruction mix of a kernel's main loop, from its SASS, without a GPU:

    nvcc ... -gencode=arch=compute_90a,code=sm_90a \
        -c csrc/cuda/instances/sm90_fwd_bf16_32x64_channel_first_narrow_rows.cu -o k.o
    cuobjdump --dump-sass k.o | python bench/tune/sass_loop_mix.py \
        --kernel "flash_fwd_sm90_kernel<(psa_fa2::DType)2, 32, 64, (psa_fa2::Layout)1, 8, (psa_fa2::KVRead)0, 8>"

(--kernel is a substring of the demangled name. The wgmma forward's template arguments are
DType, dk, dv, Layout, the Q / out row width in bytes, KVRead (0 rows, 1 / 2 K / V tile images
read by CTAs of two / three warpgroups) and the K / V width; the wgmma backward's
(flash_bwd_sm90_kernel) DType, dk, dv, Layout, the K / V width, StreamRead (0 rows, 1 Q / dO
stream images) and the Q / dO width.)

(cuobjdump ships with the CUDA toolkit, and also in triton's wheel under
triton/backends/nvidia/bin.) For each function whose demangled name contains --kernel, it
lists the loops (backward branches) with their length and MUFU / HGMMA / LDGSTS counts, then
the opcode counts of the loop with the most MUFU ops: the softmax loop of the attention
kernels. A loop's count covers all of its code, including the branches a step rarely takes
(a recomputed tile, the copies of a partial tile), so compare variants' counts, not absolute
cycles.
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def functions(sass):
    """(mangled name, [(address, instruction text)]) per function of a cuobjdump listing."""
    for chunk in sass.split("Function : ")[1:]:
        name, _, body = chunk.partition("\n")
        code = []
        for line in body.splitlines():
            m = INSTRUCTION.match(line)
            if m:
                code.append((int(m.group(1), 16), re.sub(r"\s+", " ", m.group(2))))
        yield name.strip(), code


def opcode(text):
    words = text.split()
    op = words[1] if words[0].startswith("@") else words[0]  # drop a predicate guard
    return op.split(".")[0]


def loops(code):
    """(first, last) addresses of every backward branch's range."""
    for address, text in code:
        m = BRANCH_TARGET.search(text)
        if m and int(m.group(1), 16) < address:
            yield int(m.group(1), 16), address


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", nargs="?", help="cuobjdump --dump-sass output (default: stdin)")
    ap.add_argument("--kernel", default="", help="substring of the demangled function name")
    ap.add_argument("--top", type=int, default=20, help="opcodes listed for the softmax loop")
    args = ap.parse_args()
    sass = open(args.sass).read() if args.sass else sys.stdin.read()
    found = list(functions(sass))
    names = demangle([name for name, _ in found])
    matched = False
    for (_, code), name in zip(found, names):
        if args.kernel not in name:
            continue
        matched = True
        print(f"{name}: {len(code)} instructions")
        ranges = []
        for first, last in loops(code):
            body = [text for address, text in code if first <= address <= last]
            count = collections.Counter(opcode(t) for t in body)
            ranges.append((count["MUFU"], len(body), first, last, count))
            print(f"  loop {first:#x}-{last:#x}: {len(body)} instructions, MUFU {count['MUFU']}, "
                  f"HGMMA {count['HGMMA']}, LDGSTS {count['LDGSTS']}")
        if ranges:
            _, length, first, last, count = max(ranges, key=lambda r: (r[0], r[1]))
            mix = ", ".join(f"{op} {n}" for op, n in count.most_common(args.top))
            print(f"  softmax loop {first:#x}-{last:#x} ({length}): {mix}")
    if not matched:
        sys.exit(f"no function matches --kernel {args.kernel!r}")


if __name__ == "__main__":
    main()
