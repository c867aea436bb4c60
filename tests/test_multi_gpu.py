"""The operators on a machine with several GPUs, and a model with our blocks under DDP.

Device placement: inputs on one GPU while another is current give what they give with their
own GPU current, run on their GPU's current stream, and allocate nothing on the current GPU;
inputs on two devices are refused with both named. DDP: tests/ddp_worker.py under torchrun
on two GPUs. Everything here needs two GPUs and skips without them, except the mixed-device
errors between a GPU and the CPU, which need one.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import psa_fa2_ext
from helpers import requires_cuda
from two_gpus import TESTS, requires_nccl, requires_two_gpus, subprocess_env

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# The block's shapes (dk 32, dv 64). N = 49 (not a multiple of 8) takes the copies to aligned
# rows or tile images on Hopper; at N = 400, B * H = 4 is a small grid, where the fp32 forward
# splits the keys among CTAs through a scratch buffer.
B, H, DK, DV = 2, 2, 32, 64
SEQLENS = [49, 400]
# (GPU the tensors are on, GPU current while the op runs)
PLACEMENTS = [pytest.param(1, 0, id="data1-current0"), pytest.param(0, 1, id="data0-current1")]


def _randn(*shape, device, dtype, seed) -> torch.Tensor:
    """Made on the CPU, so that every device gets the same numbers."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def _block_step(base: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """psa_attention on the block's split views, and the gradient of <out, dout> in base."""
    base = base.detach().requires_grad_()
    q, k, v = base.view(B, H, 2 * DK + DV, -1).split([DK, DK, DV], dim=2)
    out = psa_fa2_ext.psa_attention(q, k, v)
    (grad,) = torch.autograd.grad(out, base, dout)
    return out.detach(), grad


def _allocations(device: int) -> int:
    """How many blocks the caching allocator of ``device`` has handed out so far."""
    return torch.cuda.memory_stats(device)["allocation.all.allocated"]


@requires_two_gpus
@pytest.mark.parametrize("n", SEQLENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("data,current", PLACEMENTS)
def test_block_forward_backward_off_the_current_device(data, current, dtype, n):
    dev = f"cuda:{data}"
    base = _randn(B, H * (2 * DK + DV), n, device=dev, dtype=dtype, seed=0)  # the qkv conv's output
    dout = _randn(B, H, DV, n, device=dev, dtype=dtype, seed=1)
    with torch.cuda.device(data):
        want_out, want_grad = _block_step(base, dout)
    torch.cuda.synchronize(data)
    with torch.cuda.device(current):
        before = _allocations(current)
        out, grad = _block_step(base, dout)
        assert torch.cuda.current_device() == current  # the op's device guard put it back
        assert _allocations(current) == before, f"the op allocated on cuda:{current}"
    assert out.device == grad.device == torch.device("cuda", data)
    # The same kernels on the same GPU: the forward is the same bits. The backward's dq / dk
    # may be summed with atomics (in any order) unless deterministic, so its tolerance is
    # the dtype's rounding.
    assert torch.equal(out, want_out)
    torch.testing.assert_close(grad, want_grad)


@requires_two_gpus
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("data,current", PLACEMENTS)
def test_fwd_bwd_ops_off_the_current_device_bit_for_bit(data, current, dtype):
    """The raw operators, backward deterministic: every output is the same bits as with the
    tensors' own GPU current."""
    dev, n, scale = f"cuda:{data}", 97, DK ** -0.5
    q, k = (_randn(B, H, n, DK, device=dev, dtype=dtype, seed=s) for s in (2, 3))
    v, dout = (_randn(B, H, n, DV, device=dev, dtype=dtype, seed=s) for s in (4, 5))

    def run():
        out, lse = psa_fa2_ext.fwd(q, k, v, scale)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        psa_fa2_ext.bwd(dout, q, k, v, out, lse, scale, dq, dk, dv, deterministic=True,
                        accumulate=False)
        return out, lse, dq, dk, dv

    with torch.cuda.device(data):
        want = run()
    with torch.cuda.device(current):
        before = _allocations(current)
        got = run()
        assert _allocations(current) == before, f"the op allocated on cuda:{current}"
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert g.device == torch.device("cuda", data), name
        assert torch.equal(g, w), f"{name} differs from the run with cuda:{data} current"


@requires_two_gpus
def test_ops_run_on_the_current_stream_of_the_tensors_device():
    """cuda:0 current, the tensors on cuda:1, whose current stream is a side stream that is
    still writing them: the op must queue behind that write on that stream. Had it run on
    cuda:1's default stream (or on cuda:0), it would read the old values, which the write is
    held back behind a ~0.1 s sleep to make sure of."""
    dev, dtype, n, scale = "cuda:1", torch.bfloat16, 400, DK ** -0.5
    old = [_randn(B, H, n, d, device=dev, dtype=dtype, seed=6 + i) for i, d in enumerate((DK, DK, DV))]
    new = [_randn(B, H, n, d, device=dev, dtype=dtype, seed=9 + i) for i, d in enumerate((DK, DK, DV))]
    dout = _randn(B, H, n, DV, device=dev, dtype=dtype, seed=12)
    with torch.cuda.device(1):
        want_out, want_lse = psa_fa2_ext.fwd(*new, scale)
        want_d = [torch.empty_like(t) for t in new]
        psa_fa2_ext.bwd(dout, *new, want_out, want_lse, scale, *want_d, deterministic=True,
                        accumulate=False)
    torch.cuda.synchronize(1)

    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # cycles: about 0.1 s at 2 GHz, on the side stream
        for t, src in zip(old, new):
            t.copy_(src)
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(1) == side
            out, lse = psa_fa2_ext.fwd(*old, scale)
            d = [torch.empty_like(t) for t in old]
            psa_fa2_ext.bwd(dout, *old, out, lse, scale, *d, deterministic=True,
                            accumulate=False)
    torch.cuda.synchronize(1)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for name, g, w in zip(("dq", "dk", "dv"), d, want_d):
        assert torch.equal(g, w), name


# --- mixed devices: refused, naming the argument, the device expected and the one that came --

def _mixed_cases(dev_q: str, dev_other: str):
    """(call, expected message) for q on dev_q and one other operand on dev_other."""
    n, scale = 10, 0.5

    def t(dev, d=DK):
        return torch.randn(B, H, n, d, device=dev)

    q, k, v = t(dev_q), t(dev_q), t(dev_q, DV)
    out, lse = psa_fa2_ext.fwd(q, k, v, scale)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    k_other, v_other = t(dev_other), t(dev_other, DV)
    msg = r"{} must be on the device of q \({}\), got {}"
    return [
        (lambda: psa_fa2_ext.fwd(q, k_other, v, scale), msg.format("k", dev_q, dev_other)),
        (lambda: psa_fa2_ext.attention(q, k, v_other), msg.format("v", dev_q, dev_other)),
        (lambda: psa_fa2_ext.psa_attention(q.transpose(2, 3), k_other.transpose(2, 3),
                                           v.transpose(2, 3)),
         msg.format("k", dev_q, dev_other)),
        (lambda: psa_fa2_ext.bwd(out, q, k, v, out, lse, scale, grads[0],
                                 torch.empty_like(k_other), grads[2]),
         msg.format("dk", dev_q, dev_other)),
        (lambda: psa_fa2_ext.bwd(out, q, k, v, out, lse.to(dev_other), scale, *grads),
         msg.format("lse", dev_q, dev_other)),
    ]


@requires_two_gpus
@pytest.mark.parametrize("dev_q,dev_other", [("cuda:0", "cuda:1"), ("cuda:1", "cuda:0")])
def test_operands_on_two_gpus_are_refused(dev_q, dev_other):
    for call, message in _mixed_cases(dev_q, dev_other):
        with pytest.raises(RuntimeError, match=message):
            call()


@requires_cuda
def test_operands_on_gpu_and_cpu_are_refused():
    for call, message in _mixed_cases("cuda:0", "cpu") + _mixed_cases("cpu", "cuda:0"):
        with pytest.raises(RuntimeError, match=message):
            call()


# --- DDP: tests/ddp_worker.py under torchrun ------------------------------------------------

def _torchrun(out, *args) -> dict:
    """Runs the worker on two GPUs; returns rank 0's report."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(TESTS / "ddp_worker.py"), "--out", str(out), *args]
    # cuBLAS is deterministic only with a fixed workspace, which it reads from here.
    env = subprocess_env(CUBLAS_WORKSPACE_CONFIG=":4096:8")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"torchrun exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return json.loads((out / "report.json").read_text())


# The DDP result's error against float64 may be at most twice the single process's (the
# helpers' rule for same-precision results), plus a floor for where both are near exact.
_FLOOR = 1e-6


def _check_report(report: dict) -> None:
    assert report["world"] == 2
    for precision in ("fp32", "bf16"):
        steps = report[precision]
        assert len(steps) >= 2
        for step in steps:
            where = f"{precision} step {step['step']}"
            loss = step["loss"]
            assert loss["ddp"] <= 2 * loss["single"] + _FLOOR, f"{where}: loss {loss}"
            for name, err in step["grads"].items():
                assert err["ddp"] <= 2 * err["single"] + _FLOOR, f"{where}: {name} gradient {err}"


@requires_two_gpus
@requires_nccl
def test_ddp_gradients_match_one_process_on_the_global_batch(tmp_path):
    _check_report(_torchrun(tmp_path))


@requires_two_gpus
@requires_nccl
def test_ddp_deterministic_runs_are_bit_for_bit(tmp_path):
    for run in ("a", "b"):
        _check_report(_torchrun(tmp_path / run, "--deterministic"))
    for rank in (0, 1):
        a, b = (torch.load(tmp_path / run / f"rank{rank}.pt") for run in ("a", "b"))
        for precision in ("fp32", "bf16"):
            for step, (ga, gb) in enumerate(zip(a[precision]["grads"], b[precision]["grads"])):
                for i, (x, y) in enumerate(zip(ga, gb)):
                    assert torch.equal(x, y), f"rank {rank} {precision} step {step} gradient {i}"
            for i, (x, y) in enumerate(zip(a[precision]["params"], b[precision]["params"])):
                assert torch.equal(x, y), f"rank {rank} {precision} final weight {i}"
    # The all-reduce leaves every rank the same gradients.
    r0, r1 = (torch.load(tmp_path / "a" / f"rank{r}.pt") for r in (0, 1))
    for precision in ("fp32", "bf16"):
        for ga, gb in zip(r0[precision]["grads"], r1[precision]["grads"]):
            assert all(torch.equal(x, y) for x, y in zip(ga, gb)), precision
