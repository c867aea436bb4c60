"""The benchmark's own yardsticks on the CPU: peak RSS, the blockwise reference, the planner."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import plan  # noqa: E402
import reference  # noqa: E402
import rss  # noqa: E402


@pytest.mark.skipif(rss.unavailable() is not None, reason=str(rss.unavailable()))
def test_peak_rss_sees_a_freed_temporary():
    size = 64 << 20

    def call():
        x = torch.ones(size // 4)   # written, so resident; freed before the call returns
        return float(x[-1])

    _, peak = rss.peak_added(call)
    assert peak >= 0.9 * size
    _, small = rss.peak_added(lambda: 1)
    assert small < 0.1 * size


def _eager(q, k, v, scale, dout):
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    out = v @ ((q.transpose(-2, -1) @ k) * scale).softmax(-1).transpose(-2, -1)
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


def test_reference_blockwise_matches_autograd(monkeypatch):
    g = torch.Generator().manual_seed(0)
    B, H, N, dk, dv = 2, 2, 50, 8, 16
    q, k = torch.randn(B, H, dk, N, generator=g), torch.randn(B, H, dk, N, generator=g)
    v, dout = torch.randn(B, H, dv, N, generator=g), torch.randn(B, H, dv, N, generator=g)
    # Blocks of 7 query rows: several full blocks and a shorter last one.
    monkeypatch.setattr(reference, "BLOCK_BYTES", B * H * N * 8 * 7)
    got = reference.reference(q, k, v, dk ** -0.5, dout)
    for x, want in zip(got, _eager(q, k, v, dk ** -0.5, dout)):
        torch.testing.assert_close(x, want, rtol=1e-12, atol=1e-12)
    assert reference.reference(q, k, v, dk ** -0.5)[1] is None


def test_reference_cache_needs_equal_values():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 8, 16, generator=g).bfloat16() for _ in range(3))
    cache, ref = reference.Cache(), reference.reference(q, k, v, 0.5)
    cache.put(q, k, v, 0.5, None, ref)
    assert cache.get(q.float(), k.float(), v.float(), 0.5) is ref      # same numbers, other dtype
    assert cache.get(q.float() * 2, k.float(), v.float(), 0.5) is None
    assert cache.get(q, k, v, 0.25) is None


def test_planner_scales_by_work_and_refuses():
    p = plan.Planner(budget_s=10.0, memory_guard=True)
    key = ("eager", "fwd", "fp32", 32, 64)
    assert p.predict(key, 100) is None and p.refuse(None, 1e9) is None
    p.record(key, 100, 0.5, 1000.0, "small")
    pred = p.predict(key, 400)
    assert pred.seconds == pytest.approx(2.0) and pred.peak_bytes == pytest.approx(4000.0)
    assert p.refuse(pred, 5.0) is None
    status, note = p.refuse(pred, 60.0)
    assert status == "skipped" and "budget" in note
    huge = plan.Prediction(seconds=1.0, peak_bytes=float(1 << 60), basis="small")
    if plan.mem_available():
        assert "MemAvailable" in p.refuse(huge, 1.0)[1]
    # Time per unit of work that grew from one row to the next keeps growing beyond them.
    p.record(key, 200, 2.0, None, "middle")
    assert p.predict(key, 400).seconds == pytest.approx(2.0 * 2 * 2)
    # ... but not from two rows of nearly the same work, whose difference is noise.
    q = plan.Planner()
    q.record(key, 100, 0.1, None, "probe")
    q.record(key, 120, 0.5, None, "first row")
    assert q.predict(key, 1920).seconds == pytest.approx(0.5 * 16)


@pytest.mark.parametrize("block,shape", [("aattn", (2, 2, 48, 4)), ("aattn", (1, 3, 20, 1)),
                                         ("aifi", (2, 2, 24, 1))])
def test_block_peers_match_the_reference(block, shape):
    # Every CPU peer of the AAttn / AIFI rows, forward and backward, in the layout its block
    # goes on with, against the float64 reference taken through layouts.py's conversions.
    import layouts
    import measure
    import peers

    B, H, N, area = shape
    case = peers.Case(dk=32, dv=32, scale=32 ** -0.5, dtype=torch.float32,
                      device=torch.device("cpu"), block=block, area=area)
    src, dout = layouts.make_inputs(case, B, H, N, seed=0)
    q, k, v, d = layouts.to_reference(block, area, *layouts.views(block, src, H, 32, 32), dout)
    ref = layouts.from_reference(block, area, reference.reference(q, k, v, case.scale, d))
    for name in peers.CPU_DEFAULT:
        fn = peers.build(name, case)[0].fn
        fwd = measure.make_step(fn, "fwd", *layouts.views(block, src, H, 32, 32), dout)()
        torch.testing.assert_close(fwd.double(), ref[0], rtol=0, atol=1e-5, msg=name)
        got = measure.make_step(fn, "fwd+bwd", *layouts.views(block, layouts.leaf(src), H, 32, 32),
                                dout)()
        for x, want in zip(got, ref):
            torch.testing.assert_close(x.double(), want, rtol=0, atol=1e-5, msg=name)


def test_model_training_step_reports_the_attention_blocks_share(tmp_path):
    """bench_model.py's training step (on the CPU where no GPU is visible): each model's attention blocks, timed alone on
    the inputs they got in a step, take some but not all of the step's time, eager and
    patched (RT-DETR's loss needs the class count the trainer would set)."""
    pytest.importorskip("ultralytics")
    import bench_model

    results = bench_model.main(["--models", "yolo12n", "rtdetr-l", "--sizes", "64",
                                "--train-sizes", "64", "--train-batch", "2", "--iters", "1",
                                "--warmup", "1", "--no-plots", "--out", str(tmp_path)])
    assert len(results["train"]) == 4
    for row in results["train"]:
        assert row["status"] == "ok", row
        assert 0 < row["attn_ms"] < row["time_ms"], row
    (report,) = tmp_path.glob("bench_model_*.md")  # _cpu, or _cuda where a GPU is visible
    assert "eager share" in report.read_text()
