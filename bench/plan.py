"""What a row will cost before it runs, from the rows measured before it; which rows to skip.

A prediction scales the largest earlier row of the same (peer, mode, dtype, head dims) by
the work, B*H*N^2:
- seconds per call: that row's time per unit of work, times the new work. Where the time per
  unit of work grew between that row and the next smaller one (a kernel that falls out of
  cache, a slow path for large operands), the growth is assumed to go on at the same rate,
  per doubling of work; it is never assumed to shrink. "The next smaller one": at most half
  the work, so that the growth is measured, not noise.
- peak memory: that row's peak times the work ratio. Exact for peers that hold N x N
  matrices, an overestimate for those whose memory grows with N only.

Rows are skipped, with the prediction in their note, when
- (CPU) the predicted peak exceeds MEMORY_SHARE of the memory the kernel reports available:
  a process that runs out of memory on a machine without swap is killed, results and all;
- a time budget is set and the predicted calls would end after it;
- a cap per row is set and the predicted calls would take longer: the default CPU run keeps
  to a few minutes by leaving out the rows of peers that take minutes at the largest shapes
  (eager bf16's backward, SDPA's CPU flash backward in bf16), so that every shape still runs.
"""
import dataclasses
import math
import time

# Of MemAvailable: the rest is margin for the prediction's error and for other processes.
MEMORY_SHARE = 0.5


@dataclasses.dataclass
class Prediction:
    seconds: float        # per call
    peak_bytes: float     # None where the rows before it measured none
    basis: str            # which row it was scaled from


def work(B, H, N):
    return B * H * N * N


def mem_available():
    """Bytes the kernel says can be allocated without swapping, or None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Planner:
    def __init__(self, budget_s=None, memory_guard=True, row_cap_s=None):
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.row_cap_s = row_cap_s
        self.memory_guard = memory_guard
        self._seen = {}   # key -> {work: (seconds per call, peak bytes or None, label)}

    def elapsed(self):
        return time.perf_counter() - self.t0

    def left(self):
        return None if self.budget_s is None else self.budget_s - self.elapsed()

    def known(self, key):
        return bool(self._seen.get(key))

    def record(self, key, w, seconds, peak_bytes, label):
        self._seen.setdefault(key, {})[w] = (seconds, peak_bytes, label)

    def predict(self, key, w):
        seen = self._seen.get(key)
        if not seen:
            return None
        works = sorted(seen)
        below = [x for x in works if x <= w]
        base = below[-1] if below else works[0]
        seconds, peak, label = seen[base]
        rate = seconds / base
        # Growth is read over at least a doubling of work: between two rows of nearly the same
        # work (a probe and a first row) it is the clock's noise, and raised to the power of
        # many such steps it predicted rows of hours that take a second.
        smaller = [x for x in works if x <= base / 2]
        if smaller and w > base:
            prev = smaller[-1]
            growth = rate / (seen[prev][0] / prev)
            if growth > 1:
                # The same growth of time per unit of work per doubling of work, onwards.
                rate *= growth ** (math.log2(w / base) / math.log2(base / prev))
        return Prediction(seconds=rate * w, peak_bytes=None if peak is None else peak * w / base,
                          basis=label)

    def refuse(self, pred, seconds_needed):
        """None when the row may run, else (status, note)."""
        if pred is None:
            return None
        avail = mem_available() if self.memory_guard else None
        if avail and pred.peak_bytes is not None and pred.peak_bytes > MEMORY_SHARE * avail:
            return ("skipped", f"predicted peak {pred.peak_bytes / 2**30:.1f} GiB (from {pred.basis}) "
                               f"over {MEMORY_SHARE:g} x MemAvailable ({avail / 2**30:.1f} GiB)")
        if self.row_cap_s is not None and seconds_needed > self.row_cap_s:
            return ("skipped", f"predicted {seconds_needed:.0f} s ({pred.seconds:.2g} s per call, "
                               f"from {pred.basis}), over the cap of {self.row_cap_s:g} s per row "
                               "(--row-cap-s inf runs it)")
        left = self.left()
        if left is not None and seconds_needed > left:
            return ("skipped", f"predicted {seconds_needed:.0f} s ({pred.seconds:.2g} s per call, "
                               f"from {pred.basis}), {max(left, 0):.0f} s left of the budget")
        return None
