"""Clocks for the benchmark: GPU-only kernel time, host wall time, peak extra memory."""
import math
import statistics
import time

import torch

# A call below this is short enough that its host-side launch cost could show in a
# plain event loop, so it is timed from a CUDA graph instead; above it the GPU queue
# stays full while Python enqueues the next call, and events around a loop are GPU time.
GRAPH_BELOW_S = 5e-3
# Calls captured into one graph; replays of it cover the rest of the iterations, which
# keeps capture (and the graph's node count) small while one replay launch per 32 calls
# stays negligible.
GRAPH_CALLS = 32
MAX_ITERS = 2000


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


def _events(fn, n, replay_of=None):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        (replay_of.replay if replay_of is not None else fn)()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _graph_times(fn, device, n, repeats):
    calls = min(GRAPH_CALLS, n)
    replays = math.ceil(n / calls)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()   # allocations and lazy inits happen off-capture, as CUDA-graph capture needs
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    sync(device)
    try:
        return [_events(None, replays, graph) / (replays * calls) for _ in range(repeats)]
    finally:
        del graph


def kernel_time(fn, device, est_s, target_s, repeats):
    """(median seconds per call, method) of the device work alone."""
    n = iters_for(est_s, target_s)
    if device.type != "cuda":
        times = [host_time(fn, device, n) for _ in range(repeats)]
        return statistics.median(times), f"host loop x{n}"
    method = None
    if est_s < GRAPH_BELOW_S:
        try:
            times = _graph_times(fn, device, n, repeats)
            method = f"CUDA graph x{n}"
        except Exception as e:  # noqa: BLE001 - a peer that cannot be captured is still timed
            method = f"events x{n} (graph capture failed: {type(e).__name__})"
            torch.cuda.synchronize(device)
    if method is None or not method.startswith("CUDA graph"):
        times = [_events(fn, n) / n for _ in range(repeats)]
        method = method or f"events x{n}"
    return statistics.median(times), method


def with_peak_memory(fn, device):
    """(result of one call, peak bytes allocated beyond what existed before the call)."""
    if device.type != "cuda":
        return fn(), None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = fn()
    sync(device)
    return result, torch.cuda.max_memory_allocated(device) - base
