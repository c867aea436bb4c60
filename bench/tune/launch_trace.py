"""The CUDA kernels one forward and one backward launch, per benchmark row: base name, grid,
block, dynamic + static shared memory and registers per thread, from torch.profiler's trace.

Two builds that launch the same list for every row run the same kernels on the same CTA
design, whatever their template arguments are called. Used to check that a refactor moved
no call to another kernel:

    python bench/tune/launch_trace.py > after.txt     # in each tree, then diff the two
"""
import argparse
import json
import os
import re
import sys
import tempfile

import torch

import psa_fa2_ext  # noqa: F401

SHAPES = [(16, 2, 400), (16, 4, 400), (64, 4, 400), (1, 4, 400), (16, 4, 1600), (8, 4, 6400),
          (1, 2, 62500), (16, 4, 401), (16, 4, 1601), (4, 4, 12800)]


def kernels(fn):
    """[(name, grid, block, shared memory, registers)] of the kernels fn() launches, in order."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    rows = []
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        a = e.get("args", {})
        name = re.sub(r"<.*", "", e["name"]).replace("void ", "").split("::")[-1]
        rows.append((name, tuple(a.get("grid", ())), tuple(a.get("block", ())),
                     a.get("shared memory"), a.get("registers per thread")))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"])
    args = parser.parse_args()
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    for dtype_name in args.dtypes:
        for b, h, n in SHAPES:
            torch.manual_seed(0)
            x = torch.randn(b, h * 128, n, device="cuda", dtype=dtypes[dtype_name])
            q, k, v = (t.transpose(2, 3) for t in x.view(b, h, 128, n).split([32, 32, 64], 2))
            out, lse = torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "auto")
            dout = torch.randn_like(out)
            grads = torch.empty_like(x)
            dq, dk, dv = (t.transpose(2, 3) for t in grads.view(b, h, 128, n).split([32, 32, 64], 2))
            for direction, fn in (
                    ("fwd", lambda: torch.ops.psa_fa2.fwd(q, k, v, 32 ** -0.5, "auto")),
                    ("bwd", lambda: torch.ops.psa_fa2.bwd(dout, q, k, v, out, lse, 32 ** -0.5, dq,
                                                          dk, dv, "auto", False, False))):
                fn()  # the first call sets shared-memory attributes
                for row in kernels(fn):
                    print(f"{dtype_name} {b},{h},{n} {direction}: {row}")
            del x, grads
    sys.stdout.flush()


if __name__ == "__main__":
    main()
