"""Gives this process's resident memory, open files and threads, as /v1/stats reports them."""

from __future__ import annotations

import os
import sys
import threading

try:
    import resource
except ImportError:  # Windows
    resource = None


def process_stats() -> dict:
    """Returns {"rss_bytes", "peak_rss_bytes", "open_files", "threads"} of this process; None where the OS does not say.

    Read from /proc on Linux (the current RSS; open files are the descriptors open); elsewhere only
    the peak RSS and Python's own threads are known.
    """
    peak = None
    if resource is not None:  # ru_maxrss: KiB on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"rss_bytes": status_bytes("VmRSS"), "peak_rss_bytes": peak,
            "open_files": entries("fd"), "threads": entries("task") or threading.active_count()}


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """Returns a `kB` field of process `pid`'s /proc status (VmRSS, VmHWM, RssAnon...) in bytes, or None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def entries(what: str, pid: int | str = "self") -> int | None:
    """Returns how many entries /proc/<pid>/<what> lists (fd: open files, task: threads), or None off Linux."""
    try:
        return len(os.listdir(f"/proc/{pid}/{what}"))
    except OSError:
        return None
