"""Clocks for the benchmark: GPU-only kernel time, host wall time, peak extra memory.

GPU kernel time of short calls (under GRAPH_BELOW_S) of peers known to capture cleanly
(peers.GRAPH_SAFE, forward only) is a CUDA-graph replay between CUDA events, so host
launch cost cannot show. Every other row is the sum of the device kernels' own durations
recorded by torch.profiler: a plain event loop around eager autograd calls at small
shapes measured Python, not the GPU. Capturing arbitrary third-party code is what broke
the first GPU run, so it is not tried. CUDA events around an eager loop remain only as
the fallback when the profiler fails.

On the CPU there is one clock, the host's: kernel time is a timed loop of calls.
"""
import math
import statistics
import time

import torch

import rss

# Below this a call is short enough that host launch cost could show in a plain event
# loop; above it the GPU queue stays full while Python enqueues the next call, and the
# row takes the clock of the peers that cannot be captured (FA4, Flex): the profiler's
# kernel sum. A replay is the slower clock there: on two H100s, a replay of 32 calls of our
# forward at 1,2,62500 (3.1 ms) read 0.6-8.5% above their kernel sum in every round
# (bench/tune/timing_methods.py, measured at 8d2fe5d; git history:
# bench/results/h100-2026-12-06-8d2fe5d at 28fac21), so a replayed row beside a profiled one
# would compare two clocks rather than two kernels.
GRAPH_BELOW_S = 1e-3
# Calls captured into one graph; replays of it cover the rest of the iterations, which
# keeps capture (and the graph's node count) small while one replay per 32 calls is free.
GRAPH_CALLS = 32
MAX_ITERS = 2000
# Set to the reason once graphs cannot be trusted in this process; no capture after that.
graphs_off = None
# Profiler sessions per row: each start/stop costs tens of ms, and a kernel sum, free of
# host jitter, barely varies between sessions.
PROFILE_SESSIONS = 3
# Calls per session at most: the trace (and its parsing in Python) grows with calls, while
# the sum needs no long loop to beat a timer's resolution.
PROFILE_MAX_CALLS = 200
# Kineto activity types that are device work. Others on the device timeline are spans
# over that work (gpu_user_annotation) or waits (cuda_sync): counting them would count
# the kernels again.
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
_profiler_warm = False


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def iters_for(est_s, target_s):
    return max(1, min(MAX_ITERS, math.ceil(target_s / max(est_s, 1e-7))))


def host_time(fn, device, n):
    """Seconds per call of a synchronised loop: what an eager user waits for."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / n


def _events(fn, n):
    """(GPU seconds, host enqueue seconds) for n back-to-back calls of fn."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3, host


def _recover(device):
    """Undo what a failed capture leaves behind; returns a note for the row.

    capture_end raising skips two things: torch.cuda.graph's stream restore (done by the
    caller) and the default CUDA generator's capture epilogue, whose flag then stays set
    so every later CUDA RNG call raises "Offset increment outside graph capture
    encountered unexpectedly". A capture that succeeds runs the epilogue and clears it.
    """
    global graphs_off
    main = torch.cuda.current_stream(device)
    try:
        torch.cuda.synchronize(device)
        x = torch.zeros(1, device=device)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=torch.cuda.Stream(device)):
                x.add_(1)
        finally:
            torch.cuda.set_stream(main)
        del g
        torch.cuda.synchronize(device)
        torch.randn(1, device=device)   # raises if the generator is still stuck
        return "state recovered"
    except Exception as e:  # noqa: BLE001
        graphs_off = f"recovery after a failed capture failed ({type(e).__name__})"
        return "graphs disabled for the rest of the run"


def _graph_times(fn, device, n, repeats, calls=GRAPH_CALLS):
    """Seconds per call of n calls, as replays of a graph of `calls` captured calls."""
    calls = min(calls, n)
    replays = math.ceil(n / calls)
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for _ in range(2):   # lazy inits (cuBLAS workspace of this stream) off-capture
            fn()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                fn()
    finally:
        # torch.cuda.graph does not restore the stream when capture_end raises.
        torch.cuda.set_stream(main)
    try:
        graph.replay()
        sync(device)
        return [_events(graph.replay, replays)[0] / (replays * calls) for _ in range(repeats)]
    finally:
        del graph


def device_work_us(events):
    """(summed microseconds, count) of the device kernels, memcpys and memsets in events.

    events: FunctionEvents of a profiler session (prof.events()). Host ops are skipped,
    not asked for their device time: that is their kernels' time, counted here already.
    """
    from torch.autograd import DeviceType
    total, count = 0.0, 0
    for e in events:
        if e.device_type == DeviceType.CPU:
            continue
        kind = getattr(e, "activity_type", None)   # a FunctionEvent field of newer torch only
        if (kind is not None and kind not in DEVICE_WORK) or getattr(e, "is_user_annotation", False):
            continue
        # The event's own span. device_time_total (cuda_time_total in older torch) of a
        # device event is this same span, but reads 0 for an event flagged async.
        total += e.time_range.elapsed_us()
        count += 1
    return total, count


def _profiled_times(fn, device, n, sessions):
    """Seconds of device work per call, one per profiler session of n calls."""
    # Lazy: the profiler (and CUPTI behind it) is loaded only when a CUDA row needs it.
    from torch.profiler import ProfilerActivity, profile
    global _profiler_warm
    if not _profiler_warm:
        # The first session of a process initialises CUPTI, slowly: not inside a row.
        with profile(activities=[ProfilerActivity.CUDA]):
            torch.ones(1, device=device).add_(1)
            sync(device)
        _profiler_warm = True
    times = []
    for _ in range(sessions):
        sync(device)       # work queued before the session must not be recorded in it
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            sync(device)   # every kernel has ended before the trace stops
        us, count = device_work_us(prof.events())
        if count == 0:
            raise RuntimeError("profiler recorded no device kernels")
        times.append(us * 1e-6 / n)
    return times


def kernel_time(fn, device, est_s, target_s, repeats, graph_ok=False):
    """(median seconds per call, method, note) of the device work alone.

    note says why a row was not timed the preferred way ("" when it was).
    """
    n = iters_for(est_s, target_s)
    if device.type != "cuda":
        times = [host_time(fn, device, n) for _ in range(repeats)]
        return statistics.median(times), f"host loop x{n}", ""
    note = ""
    if graph_ok and est_s < GRAPH_BELOW_S:
        if graphs_off:
            note = f"no graph: {graphs_off}"
        else:
            try:
                times = _graph_times(fn, device, n, repeats)
                return statistics.median(times), f"CUDA graph x{n}", ""
            except Exception as e:  # noqa: BLE001 - a peer that cannot be captured is still timed
                # capture_end's error hides the one raised inside the capture: report that.
                cause = e.__context__ or e
                why = (str(cause).strip().splitlines() or [""])[0][:120]
                note = f"graph capture failed ({type(cause).__name__}: {why}); {_recover(device)}"
    k = min(n, PROFILE_MAX_CALLS)
    try:
        times = _profiled_times(fn, device, k, min(PROFILE_SESSIONS, repeats))
        return statistics.median(times), f"profiler kernel sum x{k}", note
    except Exception as e:  # noqa: BLE001 - events still give a (possibly host-bound) time
        why = (str(e).strip().splitlines() or [""])[0][:120]
        note = "; ".join(filter(None, [note, f"profiler failed ({type(e).__name__}: {why}); "
                                              "CUDA events instead"]))
    gpu, host = zip(*(_events(fn, n) for _ in range(repeats)))
    method = f"events x{n}"
    # If the host needed about as long to enqueue the calls as the GPU took to run them,
    # the GPU may have waited on Python: the time is then an upper bound.
    if statistics.median(host) > 0.8 * statistics.median(gpu):
        method += ", launch-bound?"
    return statistics.median(gpu) / n, method, note


def with_peak_memory(fn, device):
    """(result of one call, peak bytes beyond what existed before the call, its seconds).

    CUDA: max_memory_allocated minus what was allocated before. CPU: the peak RSS the call
    adds (rss.py); None where the kernel offers no resettable high-water mark.
    """
    if device.type != "cuda":
        if rss.unavailable():
            t0 = time.perf_counter()
            result = fn()
            return result, None, time.perf_counter() - t0
        t0 = time.perf_counter()
        result, peak = rss.peak_added(fn)
        return result, peak, time.perf_counter() - t0
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, torch.cuda.max_memory_allocated(device) - base, time.perf_counter() - t0
