"""One benchmark row: a peer's kernel time, wall time, peak memory and error, or why not."""
import gc
import statistics
import warnings

import torch

import peers
import timing
from layouts import split_views
from reference import rel_err


def make_step(fn, mode, q, k, v, dout):
    if mode == "fwd":
        def step():
            with torch.no_grad():
                return fn(q, k, v)
    elif q._base is not None and k._base is not q._base:
        # AIFI: three projections, each viewed as heads; their gradients are dq, dk, dv.
        bases = (q._base, k._base, v._base)

        def step():
            out = fn(q, k, v)
            return (out, *torch.autograd.grad(out, bases, dout))
    elif q._base is not None:
        # The gradient is taken of the tensor the views were split from, as in training
        # (the conv output's): ours writes that one buffer directly and is not
        # differentiable in the views themselves; other peers pay autograd's copy of the
        # three view gradients into it. Its split views are dq, dk, dv.
        base, H, dk, dv = q._base, q.shape[1], q.shape[2], v.shape[2]

        def step():
            out = fn(q, k, v)
            (grad,) = torch.autograd.grad(out, base, dout)
            return (out, *split_views(grad, H, dk, dv))
    else:
        def step():
            out = fn(q, k, v)
            return (out, *torch.autograd.grad(out, (q, k, v), dout))
    return step


def is_oom(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    msg = str(e).lower()
    return "out of memory" in msg or "alloc_failed" in msg


def short_error(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:160] if msg else ''}"


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        # Each row's peak is its own, whatever the previous row (or its failure) left.
        torch.cuda.reset_peak_memory_stats(device)


def empty_row(status="ok", note=""):
    return dict(status=status, note=note, kernel_us=None, kernel_method=None, wall_us=None,
                tflops=None, vs_ours=None, peak_mb=None, err_out=None, err_dq=None,
                err_dk=None, err_dv=None)


# A call this long is its own warm-up, and one timed call of it is as good as a loop: a
# second of work is far above the clock's resolution and any one-time cost of a first call.
LONG_CALL_S = 1.0


def row_seconds(call_s, cfg):
    """Seconds a row takes whose calls take call_s each (run_peer's schedule)."""
    if call_s > LONG_CALL_S:
        # CPU: one call, timed and measured at once; GPU: the memory call, then a timed one.
        return (2 if cfg.device.type == "cuda" else 1) * call_s
    timed = max(2, cfg.repeats // 3) if call_s >= 0.5 else cfg.repeats
    loops = timed + (min(3, timed) if cfg.device.type == "cuda" else 0)   # + wall loops
    return (cfg.warmup + 1) * call_s + loops * max(cfg.target_s, call_s)


def run_peer(name, case, mode, q, k, v, dout, cfg, long_call=False):
    """One row without its error columns, and the outputs of its memory call to compute them.

    Calls: warm-up, one call for peak memory (and the outputs), then the timed calls. With
    long_call (the planner predicts calls over LONG_CALL_S), the memory call comes first and
    is the warm-up: the same peer ran at a smaller shape before, so it is not a first use. On
    a CPU that call is also the timed one: a host clock around a call of seconds is the same
    clock the timed call would read, and a second call would double the longest rows.
    """
    row = empty_row()
    device = case.device
    try:
        cands = peers.build(name, case)
    except peers.Unsupported as e:
        return dict(row, status="n/a", note=str(e)), None
    except Exception as e:  # noqa: BLE001 - a peer that breaks while building is n/a, not fatal
        return dict(row, status="OOM" if is_oom(e) else "n/a", note=short_error(e)), None
    chosen, failures, mem = None, [], None
    for cand in cands:
        step = make_step(cand.fn, mode, q, k, v, dout)
        oom, caught = False, []
        try:
            # SDPA says why a forced backend refuses only in warnings: keep them for the note.
            with warnings.catch_warnings(record=True) as caught, cand.context():
                warnings.simplefilter("always")
                if long_call:
                    mem = timing.with_peak_memory(step, device)
                    warm = [mem[2]]
                else:
                    warm = []
                    for i in range(cfg.warmup):
                        warm.append(timing.host_time(step, device, 1))
                        # The first call may compile; a slow second call needs no more warm-up.
                        if i >= 1 and warm[-1] > 0.5:
                            break
            chosen = cand
        except Exception as e:  # noqa: BLE001 - any failure of a peer becomes its row's note
            # Keep only text: the traceback's frames would hold the failed call's tensors.
            why = [str(w.message).strip().splitlines()[0][:160] for w in caught]
            failures.append(short_error(e) + (f" ({why[0]})" if why else ""))
            oom = is_oom(e)
            mem = None
        free(device)
        if oom:
            return dict(row, status="OOM", note=failures[-1]), None
        if chosen is not None:
            break
    if chosen is None:
        return dict(row, status="n/a", note="; ".join(failures)), None
    row["note"] = "; ".join(filter(None, [chosen.note] + [f"native failed: {f}" for f in failures]))
    wall = None
    try:
        with chosen.context():
            if mem is None:
                mem = timing.with_peak_memory(step, device)
            res, peak, _ = mem
            mem = None
            # Kept until the case's reference exists; in host memory, so that on a GPU they
            # weigh on no later row's peak.
            outs = tuple(x.detach().cpu() for x in (res if isinstance(res, tuple) else (res,)))
            del res
            est = min(warm[1:] or warm)
            if long_call and device.type != "cuda":
                kt, method, tnote = est, "host time of one call (the memory call itself)", ""
            else:
                if est > LONG_CALL_S:
                    repeats = 1
                else:
                    # Calls of half a second or more: few repeats, or one row would take minutes.
                    repeats = cfg.repeats if est < 0.5 else max(2, cfg.repeats // 3)
                kt, method, tnote = timing.kernel_time(step, device, est, cfg.target_s, repeats,
                                                       graph_ok=(name, mode) in peers.GRAPH_SAFE)
            if device.type == "cuda":
                n_wall = timing.iters_for(est, cfg.target_s)
                wall = statistics.median(timing.host_time(step, device, n_wall)
                                         for _ in range(min(3, repeats)))
    except Exception as e:  # noqa: BLE001
        status = "OOM" if is_oom(e) else "n/a"
        note = (row["note"] + "; " if row["note"] else "") + short_error(e)
        return dict(row, status=status, note=note), None
    finally:
        free(device)
    row["note"] = "; ".join(filter(None, [row["note"], tnote]))
    row.update(kernel_us=kt * 1e6, kernel_method=method, wall_us=None if wall is None else wall * 1e6,
               peak_mb=None if peak is None else peak / 2**20)
    return row, outs


def add_errors(row, outs, ref):
    """Fills the row's error columns from its outputs and the float64 reference."""
    if tuple(outs[0].shape) != tuple(ref[0].shape):
        # A wrong result's time means nothing: the row keeps only why.
        row.update(empty_row(status="n/a", note=f"output shape {tuple(outs[0].shape)}, "
                                                f"expected {tuple(ref[0].shape)}"))
        return
    for key, x, r in zip(("err_out", "err_dq", "err_dk", "err_dv"), outs, ref):
        row[key] = rel_err(x, r)


STEP_WARMUP = 20
STEP_TARGET_S = 0.2
STEP_REPEATS = 5
STEP_PEERS = ("ours", "sdpa", "eager")


def eager_step_row(case, qkv, H, dout, cfg):
    """Wall clock of a whole autograd step: ours vs SDPA auto vs the eager block.

    At small shapes every step is host-bound, and the host's speed drifts over seconds. So the
    three take turns: each of STEP_REPEATS rounds times each of them once (a loop of at least
    STEP_TARGET_S), so that a drift slows all three alike; a time is the median over the
    rounds (each round's times are in the row too)."""
    steps, notes = {}, []

    def failed(name, e):
        steps.pop(name, None)
        notes.append(f"{name}: {'OOM' if is_oom(e) else short_error(e)}")
        free(case.device)

    for name in STEP_PEERS:
        try:
            fn = peers.build(name, case)[0].fn
            leaf = qkv.detach().requires_grad_(True)

            def step(fn=fn, leaf=leaf):
                q, k, v = split_views(leaf, H, case.dk, case.dv)
                fn(q, k, v).backward(dout)
                leaf.grad = None   # as optimizer.zero_grad() does
            # A short loop would mostly time its first calls and the final sync.
            for _ in range(max(cfg.warmup, STEP_WARMUP)):
                step()
            est = timing.host_time(step, case.device, 1)
            steps[name] = (step, timing.iters_for(est, max(cfg.target_s, STEP_TARGET_S)))
        except Exception as e:  # noqa: BLE001
            failed(name, e)
    times = {name: [] for name in steps}
    for _ in range(STEP_REPEATS):
        for name, (step, n) in list(steps.items()):
            try:
                times[name].append(timing.host_time(step, case.device, n) * 1e6)
            except Exception as e:  # noqa: BLE001
                failed(name, e)
    steps.clear()
    free(case.device)
    us = {name: statistics.median(times[name]) if name in times and len(times[name]) == STEP_REPEATS
          else None for name in STEP_PEERS}

    def over_ours(name):
        return us[name] / us["ours"] if us["ours"] and us[name] else None

    # Each round's own ratio too: its two times were taken seconds apart, so the spread of these
    # shows how far the host's drift moves the ratio.
    both = us["ours"] is not None and us["sdpa"] is not None
    sdpa_over_ours_rounds = [s / o for s, o in zip(times["sdpa"], times["ours"])] if both else []
    return dict(ours_us=us["ours"], sdpa_us=us["sdpa"], eager_us=us["eager"],
                sdpa_over_ours=over_ours("sdpa"), eager_over_ours=over_ours("eager"),
                sdpa_over_ours_rounds=sdpa_over_ours_rounds, rounds_us=times,
                note="; ".join(notes))
