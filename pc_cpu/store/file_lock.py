"""An exclusive lock across processes and threads, on a lock file, around a read-modify-write of shared files.

POSIX flock on the lock file: the kernel drops it when its holder exits, so a killed process
never leaves the lock held. Each `exclusive` opens the file anew, and flock excludes separate
opens even within one process, so threads are excluded too. Where fcntl is missing (Windows)
only the threads of this process are excluded (a process-wide threading lock), and two processes
sharing a store can then lose updates as before.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pc_cpu.errors import StoreError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_THREADS = threading.RLock()  # the fallback without fcntl


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on the file `path` (created if missing) while the block runs.

    Raises:
        StoreError: the lock file cannot be created or opened (a read-only directory).
    """
    if fcntl is None:
        log.debug("no fcntl here: %s excludes only this process's threads", path)
        with _THREADS:
            yield
        return
    try:
        f = open(path, "a+b")  # a+: never truncates what another holder may be reading
    except OSError as exc:
        raise StoreError(f"cannot open lock file {path} ({exc.strerror}); fix the permissions of "
                         f"{path.parent} or point --store at a writable directory") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when f is closed, or its process dies
        yield
