"""Compare the SASS of every kernel in two builds: a refactor that should not change the kernels
must leave each one's machine code, registers and shared memory as they were. Needs no GPU.

    python bench/tune/compare_sass.py OLD_BUILD_DIR NEW_BUILD_DIR [--rename OLD_REGEX=NEW ...]

A build dir is setup.py's build/temp.* folder (its .o files). Kernels are matched by their
demangled names after the --rename rules (Python regexes on the new names, applied in order)
map the new names back to the old ones. Instruction addresses and encodings are left out of the
comparison; everything else (opcodes, registers, constants, branch targets) must match.
"""
import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import sys

# cuobjdump ships with the CUDA toolkit, and with triton's CUDA backend.
CANDIDATES = ["cuobjdump", "triton/backends/nvidia/bin/cuobjdump"]


def find_cuobjdump():
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    for entry in sys.path:
        path = pathlib.Path(entry) / CANDIDATES[1]
        if path.exists():
            return str(path)
    sys.exit("cuobjdump not found (CUDA toolkit, or triton's CUDA backend)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out))


def resource_usage(res_usage_output):
    """{(arch, mangled name): its resource line from "REG:" on} of `cuobjdump -res-usage`."""
    lines, arch, function = {}, None, None
    for line in res_usage_output.splitlines():
        m = re.match(r"\s*arch\s*=\s*(sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            function = m.group(1)
        m = re.match(r"\s*(REG:.*)", line)
        if m:
            lines[(arch, function)] = m.group(1)
    return lines


def kernels(build_dir, cuobjdump):
    """{(arch, mangled name): (normalized SASS, resource line)} over every .o of a build."""
    found = {}
    for obj in sorted(pathlib.Path(build_dir).rglob("*.o")):
        sass = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", str(obj)], capture_output=True,
                             text=True).stdout
        arch, name, body = None, None, []

        def close():
            if name is not None:
                found[(arch, name)] = ["\n".join(body), None]

        for line in sass.splitlines():
            m = re.match(r"\s*code for (sm_\w+)", line)
            if m:
                close()
                arch, name, body = m.group(1), None, []
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                close()
                name, body = m.group(1), []
                continue
            text = re.sub(r"/\*[0-9a-fx]+\*/", "", line)        # addresses
            text = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", text)      # encodings
            text = text.strip(" ;\t")
            # Fatbin headers (identifier = <source path>, arch = ..., code version = ...).
            if re.match(r"[a-z][a-z_ ]* = ", text) or text.startswith("Fatbin"):
                continue
            if name is not None and text and not text.startswith("."):
                body.append(text)
        close()
        for key, line in resource_usage(res).items():
            if key in found:
                found[key][1] = line
    return {key: tuple(value) for key, value in found.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rename", action="append", default=[],
                        help="REGEX=REPLACEMENT on the new demangled names, giving the old ones")
    args = parser.parse_args()
    cuobjdump = find_cuobjdump()
    old, new = kernels(args.old, cuobjdump), kernels(args.new, cuobjdump)
    old_names = demangle(sorted({name for _, name in old}))
    new_names = demangle(sorted({name for _, name in new}))
    rules = [rule.split("=", 1) for rule in args.rename]
    old_by_name = {(arch, old_names[name]): value for (arch, name), value in old.items()}
    counts, different, missing = collections.Counter(), [], []
    matched = set()
    for (arch, name), (sass, res) in sorted(new.items()):
        wanted = new_names[name]
        for pattern, replacement in rules:
            wanted = re.sub(pattern, replacement, wanted)
        if (arch, wanted) not in old_by_name:
            missing.append(f"{arch} {wanted}")
            continue
        matched.add((arch, wanted))
        old_sass, old_res = old_by_name[(arch, wanted)]
        if old_sass == sass and old_res == res:
            counts["identical"] += 1
        else:
            counts["different"] += 1
            different.append(f"{arch} {wanted}\n    old {old_res}\n    new {res}\n"
                             f"    {len(old_sass.splitlines())} -> {len(sass.splitlines())} "
                             "instructions")
    dropped = sorted(f"{arch} {name}" for arch, name in old_by_name if (arch, name) not in matched)
    print(f"{counts['identical']} kernels identical, {counts['different']} different, "
          f"{len(missing)} new without an old counterpart, {len(dropped)} old ones not built now")
    for title, items in (("different", different), ("new only", missing), ("old only", dropped)):
        if items:
            print(f"\n{title}:")
            print("\n".join(f"  {item}" for item in items))
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
