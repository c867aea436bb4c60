"""Peak resident memory (RSS) that one call adds on the CPU, from Linux's high-water mark.

CPU torch keeps no allocator statistics, so the benchmark asks the kernel: writing "5" to
/proc/self/clear_refs resets the process's RSS high-water mark (VmHWM) to its current RSS,
and VmHWM after the call is the most that was resident at any moment of it. The kernel
updates the mark before it unmaps pages, so a matrix that lives for a millisecond counts as
fully as one that lives for seconds, which a sampling thread could miss; all threads
(OpenMP workers included) share the one count. Its error is the kernel's per-CPU counter
slack (a few hundred KiB).

A forked child's ru_maxrss would be the portable alternative, but a child forked after torch
has run OpenMP work hangs in its first parallel region (GNU libgomp is not fork-safe).
"""
import ctypes
import ctypes.util

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def _malloc_trim():
    # glibc keeps freed heap chunks resident for reuse; a call that reuses them adds no RSS.
    # Returning them first makes the baseline hold only what is live.
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def _status_bytes(field):
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024   # the file says kB
    raise OSError(f"{_STATUS} has no {field}")


def unavailable():
    """None when peaks can be measured here, else why not."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        _status_bytes("VmHWM")
        return None
    except OSError as e:
        return f"no resettable RSS high-water mark ({type(e).__name__}: {e})"


def method():
    """One line for the report: how the peak column was measured."""
    trim = "after glibc's malloc_trim(0) has returned freed heap pages, " if _trim else ""
    return ("VmHWM after the call minus VmRSS before it, the RSS high-water mark reset just "
            f"before the call ({trim}echo 5 > /proc/self/clear_refs): the most memory the call, "
            "its outputs included, held resident at any moment, all threads")


def peak_added(fn):
    """(result of fn(), peak bytes of RSS above what was resident before the call)."""
    if _trim:
        _trim(0)
    with open(_CLEAR_REFS, "w") as f:
        f.write("5")
    base = _status_bytes("VmRSS")
    result = fn()
    return result, _status_bytes("VmHWM") - base
