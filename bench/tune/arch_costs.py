"""What extra SASS targets would cost and change, measured without a GPU.

    python bench/tune/arch_costs.py [--targets 8.6 8.9 12.0] [--base "8.0+PTX;9.0a"]
        [--units 'csrc/cuda/instances/sm80_*.cu'] [--jobs 2] [--full-build] [--rev HEAD]

Exports the tree of --rev (git archive) to a temp dir and takes the nvcc command line that
setup.py writes into build.ninja for the --base arch list (no compile: ninja is stopped before it
runs). Then, per CUDA unit (every .cu of the build; the SASS tables only for those --units
matches), one nvcc run builds the base gencodes plus, for each target, the one that
TORCH_CUDA_ARCH_LIST would add (compute_XY -> sm_XY), with `nvcc --time`, which splits each
run into phases by arch: a target's cost is its own preprocessing, cicc and ptxas. Prints:

1. compile time each target adds (cicc / ptxas / preprocessing, summed over units);
2. per kernel: registers, spills (LDL / STL), shared memory and instruction counts by kind for
   sm_80 and each target, and whether a target's instruction stream equals sm_80's: the same
   opcodes and operands, and the same scheduling (the control bits: stalls, barriers, yield,
   reuse);
3. the PTX JIT that a GPU without matching SASS pays once per driver cache: `ptxas` on the
   compute_80 PTX of every unit for each target, timed, with registers and spills (`-v`).

--full-build also times clean ninja builds of the base list and of base + every target
(--full-build-only: those alone); on a shared machine they time the neighbours too.
Needs nvcc and a CUDA build of torch; no GPU.
"""
import argparse
import collections
import concurrent.futures
import difflib
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from compare_sass import demangle, resource_usage  # the same folder: run as a script

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Stops torch's BuildExtension right after it writes build.ninja: setup.py alone decides the
# flags (includes, defines, -gencode), so they are the real build's.
NINJA_ONLY = """
import runpy, sys
import torch.utils.cpp_extension as ce
class Stop(Exception):
    pass
def stop(build_directory, verbose, error_prefix):
    raise Stop(build_directory)
ce._run_ninja_build = stop
sys.argv = ["setup.py", "build_ext", "--inplace"]
try:
    runpy.run_path("setup.py", run_name="__main__")
except Stop:
    pass
"""

# Instruction kinds counted per kernel (SASS opcode without its modifiers).
KINDS = {
    "HMMA": ("HMMA",), "LDSM": ("LDSM",), "LDGSTS": ("LDGSTS",), "LDG": ("LDG",),
    "STG": ("STG",), "LDS": ("LDS",), "STS": ("STS",), "FFMA": ("FFMA",), "MUFU": ("MUFU",),
    "BAR": ("BAR",), "RED/ATOM": ("RED", "REDG", "ATOM", "ATOMG"), "LDL/STL": ("LDL", "STL"),
}


def tool(name):
    """A CUDA tool: on PATH, in CUDA_HOME / /usr/local/cuda, or triton's copy (cuobjdump)."""
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (pathlib.Path(home) / "bin" / name).exists():
            return str(pathlib.Path(home) / "bin" / name)
    for entry in sys.path:
        path = pathlib.Path(entry) / "triton/backends/nvidia/bin" / name
        if path.exists():
            return str(path)
    sys.exit(f"{name} not found")


def sm(arch):
    """'8.6' -> '86', '9.0a' -> '90a', '12.0' -> '120'."""
    return arch.replace(".", "")


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)


def export_tree(rev, dest):
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def write_ninja(src, archs):
    """build.ninja for TORCH_CUDA_ARCH_LIST=archs, written by setup.py itself."""
    shutil.rmtree(src / "build", ignore_errors=True)
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=archs)
    # setup.py sets CUDA_HOME before torch reads it, but the runner imports torch first: without
    # this torch would take the nvcc on PATH (maybe a shim whose parent has no CUDA headers).
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if (pathlib.Path(home) / "include" / "cuda.h").exists():
        env["CUDA_HOME"] = home
    run([sys.executable, "-c", NINJA_ONLY], cwd=src, env=env)
    return next((src / "build").glob("temp.*/build.ninja"))


def nvcc_line(ninja):
    """(nvcc, flags before the source, flags after it without -gencode, gencodes, .cu sources)."""
    text = ninja.read_text()
    var = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+) = (.*)$", text, re.M)}
    post = shlex.split(var["cuda_post_cflags"])
    gencodes = [f for f in post if f.startswith("-gencode")]
    post = [f for f in post if not f.startswith("-gencode")]
    sources = re.findall(r"^build \S+: cuda_compile (\S+)$", text, re.M)
    return var["nvcc"], shlex.split(var["cuda_cflags"]), post, gencodes, sources


def compile_unit(nvcc, pre, post, gencodes, source, out_dir):
    obj = out_dir / (pathlib.Path(source).stem + ".o")
    times = out_dir / (pathlib.Path(source).stem + ".time.csv")
    times.unlink(missing_ok=True)
    start = time.perf_counter()
    run([nvcc, *pre, source, "-o", str(obj), *post, *gencodes, "--time", str(times)])
    return obj, times, time.perf_counter() - start


def phase_times(csv):
    """[(phase, arch, seconds)] from an `nvcc --time` file."""
    rows = []
    for line in csv.read_text().splitlines()[1:]:
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 8 and cols[7] == "ms":
            rows.append((cols[1], cols[4], float(cols[6]) / 1000))
    return rows


def target_cost(rows, target):
    """Seconds of one unit's compile that exist only for this target (sm_XY / compute_XY)."""
    per_arch = ("gcc (preprocessing 1)", "cicc", "ptxas")
    out = collections.Counter()
    for phase, arch, sec in rows:
        if phase in per_arch and arch in (f"compute_{target}", f"sm_{target}"):
            out[phase] += sec
    return out


def parse_sass(obj, cuobjdump):
    """{(arch, mangled): [(opcode, operands, control bits)]} and {(arch, mangled): resources}."""
    sass = run([cuobjdump, "-sass", str(obj)]).stdout
    code, arch, name, prev = {}, None, None, None
    for line in sass.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch, name = m.group(1), None
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            code[(arch, name)] = []
            continue
        if name is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*/\* (0x[0-9a-f]{16}) \*/", line)
        if m:
            prev = m.group(1)
            continue
        m = re.match(r"\s*/\* (0x[0-9a-f]{16}) \*/", line)
        if m and prev is not None:
            # The second 64-bit word's top bits are the control bits (stall, yield, barriers,
            # reuse): equal control bits over equal instructions mean the same schedule.
            text = prev.strip(" ;")
            pred = ""
            if text.startswith("@"):
                pred, text = text.split(None, 1)
            opcode, _, operands = text.partition(" ")
            code[(arch, name)].append((opcode, pred + " " + operands.strip(), int(m.group(1), 16) >> 41))
            prev = None
    res = {}
    for key, line in resource_usage(run([cuobjdump, "-res-usage", str(obj)]).stdout).items():
        m = re.match(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m:
            res[key] = tuple(int(g) for g in m.groups())
    return code, res


def kinds(instrs):
    counts = collections.Counter()
    for opcode, _, _ in instrs:
        base = opcode.split(".")[0]
        for kind, names in KINDS.items():
            if base in names:
                counts[kind] += 1
    counts["total"] = len(instrs)
    return counts


def normalize(instrs):
    """(opcode, operands) without the register-reuse flags (a scheduling hint) and with sm_89's
    spelling of the F2FP packs (F2FP.F16.F32.PACK_AB is sm_80's F2FP.PACK_AB)."""
    out = []
    for opcode, operands, _ in instrs:
        opcode = opcode.replace("F2FP.F16.F32.", "F2FP.").replace("F2FP.BF16.F32.", "F2FP.BF16.")
        out.append((opcode, operands.replace(".reuse", "")))
    return out


def compare(a, b, moved_too=True):
    """How b's instruction stream differs from a's: (verdict, moved, {opcode: count change}).
    'same': equal instructions and control bits (stalls, barriers, yield, reuse); 'same ops':
    equal instructions, other control bits; 'reordered': the same instructions in another
    order; 'other': other instructions. moved: b's opcodes outside the longest runs of opcodes
    common with a (register allocation aside), None where not asked (slow on long streams)."""
    if a == b:
        return "same", 0, {}
    na, nb = normalize(a), normalize(b)
    if na == nb:
        return "same ops", 0, {}
    moved = None
    if moved_too:
        oa, ob = [o for o, _ in na], [o for o, _ in nb]
        matcher = difflib.SequenceMatcher(None, oa, ob, autojunk=False)
        moved = len(ob) - sum(block.size for block in matcher.get_matching_blocks())
    ops_a = collections.Counter(o for o, _ in na)
    ops_b = collections.Counter(o for o, _ in nb)
    change = {o: ops_b[o] - ops_a[o] for o in ops_a.keys() | ops_b.keys() if ops_b[o] != ops_a[o]}
    if collections.Counter(na) == collections.Counter(nb):
        return "reordered", moved, {}
    return "other", moved, change


def short_name(demangled):
    """'void psa_fa2::fbwd::bwd_combined_kernel<psa_fa2::fbwd::Config<(psa_fa2::DType)3, 64,
    64, (psa_fa2::Layout)0> >(...)' -> 'bwd_combined_kernel<3,64,64,0>'."""
    head = demangled.split("(psa_fa2::BwdParams")[0].split("(psa_fa2::FwdParams")[0]
    head = re.sub(r"^void ", "", head)
    head = re.sub(r"\([\w:]+\)", "", head)                 # enum casts
    head = re.sub(r"[\w]+::", "", head)                     # namespaces
    head = re.sub(r"Config<([^<>]*)>", r"\1", head)
    return head.replace(" ", "")


def jit(ptxas, ptx, target):
    """(seconds, {function: (registers, spill store bytes, spill load bytes)})"""
    start = time.perf_counter()
    done = run([ptxas, f"-arch=sm_{target}", "-O3", "-v", str(ptx), "-o",
                str(ptx.with_suffix(f".{target}.cubin"))])
    sec = time.perf_counter() - start
    out, function = {}, None
    for line in done.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            function = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and function:
            out[function] = [None, int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and function in out:
            out[function][0] = int(m.group(1))
    return sec, out


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def full_build(src, archs, jobs):
    ninja = write_ninja(src, archs)
    start = time.perf_counter()
    done = subprocess.run(["ninja", "-j", str(jobs), "-C", str(ninja.parent)],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stdout[-3000:])
    return time.perf_counter() - start


def full_builds(src, args):
    print("\n## Clean builds (ninja, wall seconds)\n", flush=True)
    wide = ";".join([args.base, *args.targets])
    rows = [[f"`{archs_}`", f"{full_build(src, archs_, args.jobs):.0f}"]
            for archs_ in (args.base, wide)]
    print(table(["TORCH_CUDA_ARCH_LIST", f"wall s, {args.jobs} jobs"], rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", nargs="+", default=["8.6", "8.9", "12.0"],
                        help="SASS targets to price against the base list")
    parser.add_argument("--base", default="8.0+PTX;9.0a", help="the arch list built today")
    parser.add_argument("--units", default="csrc/cuda/instances/sm80_*.cu",
                        help="glob of the units whose kernels the SASS tables show")
    parser.add_argument("--compile", default="*",
                        help="glob (of the build's .cu paths) of the units to compile; default all")
    parser.add_argument("--jit", nargs="+", default=["8.6", "8.9", "12.0"],
                        help="targets to run ptxas for on the compute_80 PTX")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--full-build", action="store_true",
                        help="also time clean builds of base and base + targets (ninja)")
    parser.add_argument("--full-build-only", action="store_true",
                        help="only the clean builds of --full-build")
    parser.add_argument("--keep", help="work dir to keep (default: a temp dir, removed)")
    args = parser.parse_args()

    cuobjdump, ptxas = tool("cuobjdump"), tool("ptxas")
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="arch_costs_"))
    work.mkdir(parents=True, exist_ok=True)
    src, objs = work / "src", work / "obj"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    objs.mkdir(exist_ok=True)
    export_tree(args.rev, src)
    rev = run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev]).stdout.strip()
    targets = [sm(t) for t in args.targets]

    if args.full_build_only:
        full_builds(src, args)
        return
    nvcc, pre, post, base_gencodes, sources = nvcc_line(write_ninja(src, args.base))
    # What TORCH_CUDA_ARCH_LIST="8.6" adds: a virtual arch of its own, so cicc runs again.
    sources = [s for s in sources if pathlib.PurePath(s).match(str(src / args.compile))
               or pathlib.PurePath(s).match(args.compile)]
    extra = [f"-gencode=arch=compute_{t},code=sm_{t}" for t in targets]
    shown = {str(p) for p in src.glob(args.units)}
    print(f"# Extra SASS targets against `{args.base}`\n")
    print(f"Tree `{rev}`; nvcc `{nvcc}` ({run([nvcc, '--version']).stdout.splitlines()[-2]}); "
          f"{os.cpu_count()} CPU cores, {args.jobs} jobs. Base gencodes: "
          f"{' '.join(f'`{g}`' for g in base_gencodes)}; each target adds "
          f"`-gencode=arch=compute_XY,code=sm_XY`.\n")

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        units = list(pool.map(
            lambda s: (s, *compile_unit(nvcc, pre, post, base_gencodes + extra, s, objs)),
            sources))
    wall_all = time.perf_counter() - start

    # 1. Compile time.
    rows = []
    for subset, label in ((lambda s: s in shown, f"`{args.units}`"),
                          (lambda s: True, "every .cu")):
        chosen = [u for u in units if subset(u[0])]
        label += f" ({len(chosen)} units)"
        every = sum(sec for u in chosen for _, _, sec in phase_times(u[2]))
        base = every
        for t in targets:
            base -= sum(sum(target_cost(phase_times(u[2]), t).values()) for u in chosen)
        rows.append([label, "base list", f"{base:.1f}", "", "", "", ""])
        for t in targets:
            cost = collections.Counter()
            for u in chosen:
                cost += target_cost(phase_times(u[2]), t)
            total = sum(cost.values())
            rows.append([label, f"+ sm_{t}", f"{total:.1f}", f"{cost['cicc']:.1f}",
                         f"{cost['ptxas']:.1f}", f"{cost['gcc (preprocessing 1)']:.1f}",
                         f"{100 * total / base:.0f}%"])
    print("## Compile time (CPU seconds, from `nvcc --time`)\n")
    print(table(["units", "target", "CPU s", "cicc", "ptxas", "preprocessing", "of base"], rows))
    print(f"\nAll units with every target: {wall_all:.0f} s wall at {args.jobs} jobs. A whole "
          f"build adds about (CPU s of every .cu) / jobs per target.\n")

    # 2. SASS per kernel.
    code, res = {}, {}
    for source, obj, _, _ in units:
        if source in shown:
            c, r = parse_sass(obj, cuobjdump)
            for key in c:
                code[key + (pathlib.Path(source).stem,)] = c[key]
            res.update(r)
    names = demangle(sorted({k[1] for k in code}))
    archs = ["sm_80"] + [f"sm_{t}" for t in targets]
    kernels = sorted({(k[2], k[1]) for k in code if k[0] == "sm_80"})
    agg = {a: collections.Counter() for a in archs}
    verdict = {a: collections.Counter() for a in archs[1:] + ["sm_89 vs sm_86"]}
    changes = {a: collections.Counter() for a in archs[1:]}
    rows = []
    for unit, mangled in kernels:
        base = code[("sm_80", mangled, unit)]
        row = [unit.removeprefix("sm80_"), short_name(names[mangled])]
        for a in archs:
            instrs = code.get((a, mangled, unit))
            if instrs is None:
                row.append("-")
                continue
            reg, stack, shared, local = res.get((a, mangled), (0, 0, 0, 0))
            k = kinds(instrs)
            agg[a] += k
            agg[a]["kernels"] += 1
            agg[a]["REG"] += reg
            agg[a]["static shared B"] += shared
            agg[a]["stack + local B"] += stack + local
            agg[a]["spilling kernels"] += bool(k["LDL/STL"] or local)
            cell = f"{reg} R, {k['total']} i"
            if k["LDL/STL"] or local or stack:
                cell += f", {k['LDL/STL']} LDL/STL, {stack + local} B stack"
            if a != "sm_80":
                # Only within a major version is sm_80's stream a fair yardstick.
                v, moved, change = compare(base, instrs, a[3] == "8")
                verdict[a][v] += 1
                agg[a]["moved"] += moved or 0
                changes[a].update(change)
                cell += f"; {v}" + (f", {moved} moved" if moved else "")
                if a == "sm_89" and ("sm_86", mangled, unit) in code:
                    v89, _, _ = compare(code[("sm_86", mangled, unit)], instrs, False)
                    verdict["sm_89 vs sm_86"][v89] += 1
            row.append(cell)
        rows.append(row)
    print("## SASS against sm_80, summed over kernels\n")
    kind_names = ["kernels", "REG", "static shared B", "stack + local B", "total", *KINDS,
                  "spilling kernels", "moved"]
    print(table(["", *archs], [[k, *(agg[a][k] for a in archs)] for k in kind_names]))
    print("\nInstruction streams against sm_80 (kernels): " + "; ".join(
        f"{a}: " + ", ".join(f"{n} {v}" for v, n in sorted(verdict[a].items()))
        for a in verdict if verdict[a]) + ".")
    print("`same`: equal instructions and control bits; `same ops`: equal instructions, other "
          "control bits (stalls, barriers, reuse); `reordered`: the same instructions (register "
          "reuse flags and sm_89's F2FP spelling aside) in another order; `other`: other "
          "instructions too. moved (8.x targets): opcodes outside the longest runs of opcodes "
          "common with sm_80's.\n")
    for a in archs[1:]:
        top = sorted(changes[a].items(), key=lambda kv: -abs(kv[1]))[:12]
        if top:
            print(f"Opcode count changes, {a} against sm_80 (all kernels): "
                  + ", ".join(f"{o} {n:+d}" for o, n in top) + ".\n")
    print("### Per kernel (R: registers, i: instructions)\n")
    print(table(["unit", "kernel", *archs], rows))

    # 3. JIT of the compute_80 PTX.
    jit_targets = [sm(t) for t in args.jit]
    jit_rows, jit_total = [], collections.Counter()
    jit_spills = {t: [] for t in jit_targets}
    ptx_dir = work / "ptx"
    ptx_dir.mkdir(exist_ok=True)
    for source, obj, _, _ in units:
        ptx = run([cuobjdump, "-ptx", str(obj)]).stdout
        # cuobjdump prints each PTX after a header; keep the compute_80 one (the only PTX).
        body = ptx[ptx.find(".version"):] if ".version" in ptx else ""
        body = body.split("\nFatbin")[0]
        if ".entry" not in body:
            continue
        path = ptx_dir / (pathlib.Path(source).stem + ".ptx")
        path.write_text(body)
        for t in jit_targets:
            sec, funcs = jit(ptxas, path, t)
            jit_total[t] += sec
            jit_total[(t, "shown")] += sec if source in shown else 0
            jit_total[(t, "max")] = max(jit_total[(t, "max")], sec)
            for f, (reg, st, ld) in funcs.items():
                jit_total[(t, "kernels")] += 1
                if reg is not None and reg >= 255:
                    jit_spills[t].append(f"{short_name(demangle([f])[f])}: {reg} R")
                if st or ld:
                    jit_spills[t].append(f"{pathlib.Path(source).stem} "
                                         f"{short_name(demangle([f])[f])}: {st} B stores / {ld} B loads")
    for t in jit_targets:
        jit_rows.append([f"sm_{t}", jit_total[(t, "kernels")], f"{jit_total[t]:.1f}",
                         f"{jit_total[(t, 'shown')]:.1f}", f"{jit_total[(t, 'max')]:.2f}",
                         "; ".join(jit_spills[t]) or "none"])
    print("\n## PTX JIT: `ptxas -O3` on the compute_80 PTX (one thread, seconds)\n")
    print(table(["target", "kernels", "every unit", f"`{args.units}`", "largest unit",
                 "spills / 255 registers"], jit_rows))

    if args.full_build:
        full_builds(src, args)

    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
