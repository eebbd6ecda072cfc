"""Atomic file writes, and telling the temp file of a live write from one an interrupted write left behind.

A write goes to a temp file in the target's directory, is fsync'd, then os.replace'd over the
target, so a reader sees the old file or the new one, never half of one. A process killed
mid-write (kill -9, power loss) leaves its temp file behind: an orphan that nothing reads.

Temp files are named ``.<stem>.<pid>.<random>.tmp``, pid being the writer's. A temp file is an
orphan when its writer is no longer running on this machine, or when it is older than
ORPHAN_AGE_S whatever its name says (pids are reused; names without a pid come from older
versions). A live writer's file is never an orphan: deleting it would fail that write. The
pid test assumes every writer runs on this machine, in its process namespace: on a store
shared over a network file system or between containers, another machine's live write looks
orphaned, and deleting it (a cache opening the store, a write needing room, `pc-cpu store verify
--delete`) fails that write, with an error, never a wrong entry.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"
ORPHAN_AGE_S = 3600  # seconds; a store write takes seconds, so an hour-old temp file was abandoned
_WRITER = re.compile(r"^\.[^.]*\.(\d+)\.[^.]+\.tmp$")  # .<stem>.<pid>.<random>.tmp


@dataclass(frozen=True)
class Orphan:
    """A temp file an interrupted write left behind."""

    path: Path
    size_bytes: int
    why: str  # e.g. "its writer, process 4242, is gone" or "written 3.2 h ago"


def make_temp(directory: Path, stem: str) -> tuple[int, Path]:
    """Returns (fd, path) of a new temp file in `directory` named for `stem` and this process.

    Raises:
        OSError: the directory refuses new files.
    """
    fd, name = tempfile.mkstemp(prefix=f".{stem.replace('.', '_')}.{os.getpid()}.", suffix=TEMP_SUFFIX,
                                dir=directory)
    return fd, Path(name)


def write_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Writes `chunks` to `path` so that readers see the old file or the new one; no temp file is left on error.

    Raises:
        OSError: the write, the fsync or the rename failed (disk full, no permission); `path` is unchanged.
    """
    fd, tmp = make_temp(path.parent, path.stem[:16])
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def find_orphans(directory: Path, *, now: float | None = None) -> list[Orphan]:
    """Returns the orphaned temp files in `directory` (not its subdirectories), by name.

    Temp files of live writers are left out; files that vanish while looking are skipped.
    """
    now = time.time() if now is None else now
    found = []
    try:
        candidates = sorted(p for p in directory.iterdir() if p.name.endswith(TEMP_SUFFIX))
    except FileNotFoundError:
        return []
    for path in candidates:
        try:
            stat = path.stat()
        except OSError:
            continue  # renamed into place or removed meanwhile
        why = _orphaned(path.name, now - stat.st_mtime)
        if why is not None:
            found.append(Orphan(path, stat.st_size, why))
    return found


def delete_orphans(directory: Path) -> list[Orphan]:
    """Returns the orphaned temp files in `directory` that it deleted; one that resists is logged and left.

    Temp files of live writers are never touched (find_orphans).
    """
    deleted = []
    for orphan in find_orphans(directory):
        try:
            orphan.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot delete temp file %s, left by an interrupted write (%s)", orphan.path, exc.strerror)
            continue
        deleted.append(orphan)
    return deleted


def _orphaned(name: str, age_s: float) -> str | None:
    """Returns why the temp file `name`, last written `age_s` seconds ago, is an orphan, or None if it may be live."""
    if age_s > ORPHAN_AGE_S:
        return f"an unfinished write, last written {age_s / 3600:.1f} h ago"
    match = _WRITER.match(name)
    if match and _process_alive(int(match.group(1))) is False:
        return f"an unfinished write; its writer, process {match.group(1)}, is gone"
    return None


def _process_alive(pid: int) -> bool | None:
    """Returns whether process `pid` runs on this machine; None when that cannot be told (not POSIX)."""
    if os.name != "posix" or pid <= 0:  # Windows' os.kill would terminate the process, not probe it
        return None
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    except OSError:
        return None
    return True


def _fsync_directory(directory: Path) -> None:
    """Makes a rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
