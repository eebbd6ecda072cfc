"""Tier 2: computed cells (modules, documents, conversation turns) as files in a directory, content-addressed, checksummed, atomic, LRU.

Each entry is one file named ``<key digest>.pcs`` (layout in pc_cpu.store.disk_format), written
atomically (pc_cpu.store.atomic), so a reader sees the old file or the new one, never half of one.
LRU order is the files' mtime, which `get` touches, so a second process opening the same
directory sees the same order.

Who deletes what:
- Opening the store (and `ls`) deletes nothing: a file with a bad header, or named for another key,
  is left in place and ignored (`unusable` lists it).
- `get` reads the whole entry and checks its checksums and cells (pc_cpu.store.cells); a file that
  fails (truncated, corrupted, another version, another key, garbage, impossible cells) is a miss
  (the engine re-encodes the module) and is deleted when the directory allows it; the one warning
  says whether it was.
- `verify` reports every bad file and orphaned temp file; only `verify(delete=True)` deletes them.
- Orphaned temp files (writes a killed process left unfinished, pc_cpu.store.atomic) hold nothing.
  They count against the budget from the scan at open on, and a store that writes deletes them:
  all at once when `check_writable` finds it writable (a cache opening it: a restart cleans up
  after a crash, and `verify` stops reporting them), else first when a write needs room. A store
  that never writes (`ls`, a read-only directory) never deletes.

Concurrent writers are not coordinated: ``bytes_used`` counts the files this instance scanned at
open plus those it wrote or read since.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import platformdirs

from pc_cpu.errors import CorruptEntryError, EntryTooLargeError, StoreError, UnknownEntryError
from pc_cpu.store.atomic import find_orphans, make_temp, write_atomically
from pc_cpu.store.base import ByteBudget, Evicted
from pc_cpu.store.cells import check_cells
from pc_cpu.store.disk_format import LEGACY_CONTENT_PREFIX, Header, encode_header, read_entry, read_header
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey

log = logging.getLogger(__name__)

SUFFIX = ".pcs"
DEFAULT_DISK_BUDGET_BYTES = 4 * 1024**3  # 4 GiB
_ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.pcs$")
ORPHAN = "orphan"  # BadFile.reason of a temp file an interrupted write left behind
_DIRECTORY_FIX = ("fix its permissions, point --store or $PC_CPU_STORE_DIR at a writable directory, "
                  "or keep modules in RAM only (--no-store, store=False)")


def cache_dir(name: str, variable: str, environ: Mapping[str, str] | None = None) -> Path:
    """Returns $`variable` if set, else <user cache dir>/pc_cpu/`name` (platformdirs: ~/.cache on Linux)."""
    env = os.environ if environ is None else environ
    if env.get(variable):
        return Path(env[variable]).expanduser()
    return platformdirs.user_cache_path("pc_cpu", appauthor=False) / name


def default_store_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Returns where the disk store lives: $PC_CPU_STORE_DIR, else <user cache dir>/pc_cpu/store."""
    return cache_dir("store", "PC_CPU_STORE_DIR", environ)


@dataclass(frozen=True)
class DiskListing:
    """One file of the disk store, as `DiskStore.ls` reports it."""

    key: StoreKey
    n_tokens: int
    positions: tuple[int, int]  # [start, end)
    created: float  # unix seconds the module was encoded
    size_bytes: int  # whole file: header + payload
    last_used: float  # file mtime, unix seconds (touched by get)
    path: Path

    @property
    def id(self) -> str:
        """Returns the entry's id as `pc-cpu store ls` shows it: its file name's stem, the key's digest."""
        return self.path.stem


@dataclass(frozen=True)
class BadFile:
    """A store file that failed its checks, or an orphaned temp file, as `DiskStore.verify` reports it."""

    path: Path
    reason: str  # CorruptEntryError.reason (e.g. "checksum", "truncated", "cells"), "unreadable" or ORPHAN
    message: str  # what is wrong; after a failed delete, also why it is still there
    deleted: bool = False  # verify(delete=True) removed it


@dataclass
class _Record:
    header: Header
    size: int  # bytes of the whole file
    mtime: float  # unix seconds


class DiskStore(ByteBudget):
    """A directory of entry files kept within a byte budget, least recently used evicted first."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 budget_bytes: int = DEFAULT_DISK_BUDGET_BYTES, name: str = "disk"):
        if budget_bytes < 0:
            raise ValueError(f"disk store budget must be >= 0 bytes, got {budget_bytes}")
        self.name = name
        self.directory = Path(directory) if directory is not None else default_store_dir()
        self._budget = budget_bytes  # bytes of whole files
        self._index: OrderedDict[str, _Record] = OrderedDict()  # digest -> record, oldest first
        self._used = 0  # bytes of whole files and orphans, kept current on put/remove/get
        self._orphans: dict[Path, int] = {}  # orphaned temp file -> bytes, counted in _used until deleted
        self._unusable: dict[str, BadFile] = {}  # file name -> why the scan at open ignored it
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.directory}: {exc.strerror}; "
                             f"{_DIRECTORY_FIX}") from exc
        self._scan()

    def check_writable(self) -> None:
        """Raises StoreError, naming the fix, unless a file can be created here; then deletes the orphans found at open.

        Checked once when a cache opens the store: every encoding is written through to it,
        and a store that refuses each write would only be noticed as warnings, one per module.
        A store about to write cleans up after the writers killed before it: their temp files
        hold nothing, and left in place `pc-cpu store verify` would fail on them until someone
        ran `--delete`.
        """
        try:
            fd, probe = make_temp(self.directory, "write-check")
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"store directory {self.directory} is not writable ({exc.strerror}); "
                             f"{_DIRECTORY_FIX}") from exc
        if self._orphans:
            log.info("%s: deleting %d temp file(s) that interrupted writes left", self.directory, len(self._orphans))
            self._delete_orphans()

    def __len__(self) -> int:
        return len(self._index)

    def path_for(self, key: StoreKey) -> Path:
        """Returns the file that holds (or would hold) `key`."""
        return self.directory / (key.digest() + SUFFIX)

    def keys(self) -> list[StoreKey]:
        """Returns the keys held, least recently used first."""
        return [record.header.key for record in self._index.values()]

    def contains(self, key: StoreKey) -> bool:
        """Returns whether a file for `key` exists (unchecked), without touching its LRU position."""
        return self.path_for(key).is_file()

    def get(self, key: StoreKey) -> Entry | None:
        """Returns the checked entry for `key` and touches its file, or None on a miss.

        A file that fails any check, its cells included, is a miss: logged once, and deleted if
        the directory allows it. Never raises for file content; an unreadable file (permissions)
        is logged and reported as a miss.
        """
        digest, path = key.digest(), self.path_for(key)
        try:
            with open(path, "rb") as f:
                header, entry = read_entry(f, expected=key)
                size = os.fstat(f.fileno()).st_size
            check_cells(entry)
        except FileNotFoundError:
            self._forget(digest)
            return None
        except CorruptEntryError as exc:
            self._drop_bad(path, exc)
            return None
        except OSError as exc:
            log.warning("store file %s is unreadable (%s); treating %s as a miss", path, exc, key.describe())
            return None
        try:
            os.utime(path)  # the LRU clock, shared with other processes
        except OSError:
            pass  # a read-only store still serves; its order just goes stale
        self._forget(digest)
        self._remember(digest, _Record(header, size, _now_mtime(path)))
        return entry

    def put(self, key: StoreKey, entry: Entry) -> list[Evicted]:
        """Writes `entry` atomically; returns the keys evicted for room (oldest first, entry None).

        Raises:
            EntryTooLargeError: the file would be larger than the whole budget.
            StoreError: the file could not be written; the old entry, if any, is left intact.
        """
        header = encode_header(key, entry)
        size = len(header) + entry.nbytes
        if size > self._budget:
            raise EntryTooLargeError(
                f"{key.describe()}: {size} bytes > {self.name} budget of {self._budget} bytes; "
                f"raise the {self.name} budget")
        digest, path = key.digest(), self.path_for(key)
        self._write_atomically(path, header, entry.payload)
        self._forget(digest)
        self._unusable.pop(path.name, None)  # replaced by a good file
        evicted = self._evict_for(size)
        parsed = read_header(io.BytesIO(header))  # the exact header written, sha256 included
        self._remember(digest, _Record(parsed, size, _now_mtime(path)))
        return evicted

    def remove(self, key: StoreKey) -> bool:
        """Deletes the file for `key`; returns whether it existed.

        Raises:
            StoreError: the file exists but cannot be deleted (a read-only directory).
        """
        digest, path = key.digest(), self.path_for(key)
        known = self._forget(digest)
        self._unusable.pop(path.name, None)
        try:
            path.unlink()
        except FileNotFoundError:
            return known
        except OSError as exc:
            raise StoreError(f"cannot delete store file {path} ({exc.strerror}); {_DIRECTORY_FIX}") from None
        return True

    def ls(self) -> list[DiskListing]:
        """Returns the entries this instance knows of, least recently used first."""
        return [DiskListing(r.header.key, r.header.n_tokens, r.header.positions, r.header.created, r.size,
                            r.mtime, self.directory / (digest + SUFFIX)) for digest, r in self._index.items()]

    def entry_with_id(self, prefix: str) -> DiskListing:
        """Returns the one entry whose id (its file name's stem, as `ls` shows it) starts with `prefix`.

        Raises:
            UnknownEntryError: no entry, or several, has such an id; the message says which.
        """
        matches = [item for item in self.ls() if item.path.stem.startswith(prefix)] if prefix else []
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise UnknownEntryError(f"id {prefix!r} matches {len(matches)} stored modules; give a longer prefix "
                                    "from `pc-cpu store ls`", matches=len(matches))
        raise UnknownEntryError(f"no stored module has id {prefix!r}")

    def unusable(self) -> list[BadFile]:
        """Returns the files the scan at open left out of the index, by name; it deleted none of them.

        Those are entry files with a bad header or named for another key, and orphaned temp files;
        `verify` also reads each payload.
        """
        return sorted(self._unusable.values(), key=lambda bad: bad.path.name)

    def verify(self, *, delete: bool = False) -> list[BadFile]:
        """Returns every bad file, by name; without `delete`, nothing is deleted.

        Bad files are entry files that fail any check (checksums and cells included) and orphaned
        temp files.

        Args:
            delete: also delete them (and forget them); a file that cannot be deleted comes back
                with deleted=False and the reason in its message.
        """
        bad = [found for found in map(_check_file, self._entry_files()) if found is not None]
        bad += [BadFile(o.path, ORPHAN, o.why) for o in find_orphans(self.directory)]
        return [self._delete_bad(item) for item in bad] if delete else bad

    def clear(self) -> int:
        """Deletes every entry file and orphaned temp file; returns how many entry files went.

        Temp files of writes in progress (another process's) are left alone.

        Raises:
            StoreError: a file cannot be deleted (a read-only directory).
        """
        entries = self._entry_files()
        for path in entries + [o.path for o in find_orphans(self.directory)]:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot delete store file {path} ({exc.strerror}); {_DIRECTORY_FIX}") from None
        self._index.clear()
        self._orphans.clear()
        self._unusable.clear()
        self._used = 0
        return len(entries)

    # -- helpers -------------------------------------------------------------------------------

    def _scan(self) -> None:
        """Indexes the entry files with a good header by mtime (oldest first); notes, never deletes, the rest."""
        found: list[tuple[int, str, _Record]] = []
        for path in self._entry_files():
            try:
                with open(path, "rb") as f:
                    header = read_header(f)
                    stat = os.fstat(f.fileno())
                _check_name(path, header)
            except CorruptEntryError as exc:
                self._unusable[path.name] = BadFile(path, exc.reason, str(exc))
                continue
            except OSError as exc:
                self._unusable[path.name] = BadFile(path, "unreadable", str(exc))
                continue
            found.append((stat.st_mtime_ns, path.name, _Record(header, stat.st_size, stat.st_mtime)))
        for _, name, record in sorted(found, key=lambda t: (t[0], t[1])):
            self._remember(name[: -len(SUFFIX)], record)
        for orphan in find_orphans(self.directory):
            self._orphans[orphan.path] = orphan.size_bytes
            self._used += orphan.size_bytes
            self._unusable[orphan.path.name] = BadFile(orphan.path, ORPHAN, orphan.why)
        # info, not warning: ignoring them is safe, and every process that opens the store would say it
        if self._unusable:
            log.info("%s: %d file(s) ignored, left in place (`pc-cpu store verify` names them, `--delete` removes "
                     "them)", self.directory, len(self._unusable))

    def _entry_files(self) -> list[Path]:
        try:
            return sorted(p for p in self.directory.iterdir() if _ENTRY_NAME.match(p.name))
        except OSError as exc:
            raise StoreError(f"cannot list store directory {self.directory} ({exc.strerror}); "
                             f"{_DIRECTORY_FIX}") from exc

    def _write_atomically(self, path: Path, header: bytes, payload: bytes) -> None:
        try:
            write_atomically(path, [header, payload])
        except OSError as exc:
            raise StoreError(f"cannot write store file {path}: {exc}; free disk space, or "
                             f"{_DIRECTORY_FIX}") from exc

    def _evict_for(self, incoming: int) -> list[Evicted]:
        if self._orphans and self._used + incoming > self._budget:
            self._delete_orphans()  # they hold nothing: gone before any entry is
        evicted: list[Evicted] = []
        while self._index and self._used + incoming > self._budget:
            digest, record = self._index.popitem(last=False)
            self._used -= record.size
            (self.directory / (digest + SUFFIX)).unlink(missing_ok=True)
            evicted.append(Evicted(record.header.key, None))
            log.debug("%s: evicted %s (%d bytes)", self.name, record.header.key.describe(), record.size)
        return evicted

    def _remember(self, digest: str, record: _Record) -> None:
        self._index[digest] = record
        self._used += record.size

    def _forget(self, digest: str) -> bool:
        record = self._index.pop(digest, None)
        if record is None:
            return False
        self._used -= record.size
        return True

    def _delete_orphans(self) -> None:
        """Deletes the orphaned temp files counted in the budget; one that resists is logged and no longer counted."""
        for path, size in list(self._orphans.items()):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("%s: cannot delete orphaned temp file %s (%s); no longer counted in the budget",
                            self.name, path, exc.strerror)
            del self._orphans[path]
            self._unusable.pop(path.name, None)
            self._used -= size

    def _drop_bad(self, path: Path, exc: CorruptEntryError) -> None:
        """Forgets a file `get` found bad and deletes it if it can; the one warning says which happened."""
        self._forget(path.name[: -len(SUFFIX)])
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            known = self._unusable.get(path.name)
            self._unusable[path.name] = BadFile(path, exc.reason, str(exc))
            if known is not None and known.message == str(exc):
                return  # warned at the first read; every get would repeat it
            log.warning("store file %s is unusable (%s: %s); could not delete it (%s), so it stays, ignored; "
                        "the module will be re-encoded", path, exc.reason, exc, err.strerror)
            return
        self._unusable.pop(path.name, None)
        log.warning("store file %s is unusable (%s: %s); deleted it, the module will be re-encoded",
                    path, exc.reason, exc)

    def _delete_bad(self, bad: BadFile) -> BadFile:
        """Deletes a file `verify` found bad and forgets it; returns what `delete_bad_file` did."""
        bad = delete_bad_file(bad)
        if not bad.deleted:
            return bad
        self._forget(bad.path.name[: -len(SUFFIX)])
        self._unusable.pop(bad.path.name, None)
        size = self._orphans.pop(bad.path, None)
        if size is not None:
            self._used -= size
        return bad


def delete_bad_file(bad: BadFile) -> BadFile:
    """Deletes a file `verify` found bad; returns it marked deleted, or with why it is still there in its message."""
    try:
        bad.path.unlink(missing_ok=True)
    except OSError as exc:
        return dataclasses.replace(bad, message=f"{bad.message}; not deleted: {exc.strerror}")
    return dataclasses.replace(bad, deleted=True)


def _check_file(path: Path) -> BadFile | None:
    """Returns what is wrong with the entry file `path` (every check, cells included), or None if nothing."""
    try:
        with open(path, "rb") as f:
            header, entry = read_entry(f)
        _check_name(path, header)
        check_cells(entry)
    except CorruptEntryError as exc:
        return BadFile(path, exc.reason, str(exc))
    except OSError as exc:
        return BadFile(path, "unreadable", str(exc))
    return None


def _check_name(path: Path, header: Header) -> None:
    """Raises CorruptEntryError if the file's name is not the digest of the key it holds."""
    if header.key.content.startswith(LEGACY_CONTENT_PREFIX):
        raise CorruptEntryError("written by a pc_cpu that keyed modules by schema text; no key of this version "
                                "can match it", reason="old_key_scheme")
    if header.key.digest() != path.name[: -len(SUFFIX)]:
        raise CorruptEntryError(f"file holds {header.key.describe()}, whose digest is not its name",
                                reason="foreign_key")


def _now_mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
