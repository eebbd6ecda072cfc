"""Tier 2: encoded modules as files in a directory, content-addressed, checksummed, atomic, LRU.

Each entry is one file named ``<key digest>.pcs`` (layout in pc_cpu.store.disk_format). A write
goes to a temp file in the same directory, is fsync'd, then os.replace'd over the final name, so
a reader sees the old file or the new one, never half of one. A file that fails any check on read
(truncated, corrupted, another version, another key, garbage) is logged once, deleted, and
reported as a miss: the engine re-encodes the module. LRU order is the files' mtime, which `get`
touches, so a second process opening the same directory sees the same order.

Concurrent writers are not coordinated: ``bytes_used`` counts the files this instance scanned at
open plus those it wrote or read since.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import platformdirs

from pc_cpu.errors import CorruptEntryError, EntryTooLargeError, StoreError
from pc_cpu.store.base import Evicted
from pc_cpu.store.disk_format import LEGACY_CONTENT_PREFIX, Header, encode_header, read_entry, read_header
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey

log = logging.getLogger(__name__)

SUFFIX = ".pcs"
DEFAULT_DISK_BUDGET_BYTES = 4 * 1024**3  # 4 GiB
_ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.pcs$")
_TEMP_SUFFIX = ".tmp"
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


@dataclass(frozen=True)
class BadFile:
    """A store file that failed its checks, as `DiskStore.verify` reports it."""

    path: Path
    reason: str  # CorruptEntryError.reason, e.g. "checksum", "truncated", "bad_magic"
    message: str


@dataclass
class _Record:
    header: Header
    size: int  # bytes of the whole file
    mtime: float  # unix seconds


class DiskStore:
    """A directory of entry files kept within a byte budget, least recently used evicted first."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 budget_bytes: int = DEFAULT_DISK_BUDGET_BYTES, name: str = "disk"):
        if budget_bytes < 0:
            raise ValueError(f"disk store budget must be >= 0 bytes, got {budget_bytes}")
        self.name = name
        self.directory = Path(directory) if directory is not None else default_store_dir()
        self._budget = budget_bytes  # bytes of whole files
        self._index: OrderedDict[str, _Record] = OrderedDict()  # digest -> record, oldest first
        self._used = 0  # bytes of whole files, kept current on put/remove/get
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.directory}: {exc.strerror}; "
                             f"{_DIRECTORY_FIX}") from exc
        self._scan()

    def check_writable(self) -> None:
        """Raises StoreError, naming the fix, unless a file can be created in the directory.

        Checked once when a cache opens the store: every encoding is written through to it,
        and a store that refuses each write would only be noticed as warnings, one per module.
        """
        try:
            fd, probe = tempfile.mkstemp(prefix=".write-check.", suffix=_TEMP_SUFFIX, dir=self.directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreError(f"store directory {self.directory} is not writable ({exc.strerror}); "
                             f"{_DIRECTORY_FIX}") from exc

    @property
    def bytes_used(self) -> int:
        """Returns the bytes of the entry files this instance knows of."""
        return self._used

    @property
    def budget_bytes(self) -> int:
        """Returns the byte budget for the entry files."""
        return self._budget

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

        A file that fails any check is logged once, deleted, and reported as a miss. Never raises
        for file content; an unreadable file (permissions) is logged and reported as a miss.
        """
        digest, path = key.digest(), self.path_for(key)
        try:
            with open(path, "rb") as f:
                header, entry = read_entry(f, expected=key)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            self._forget(digest)
            return None
        except CorruptEntryError as exc:
            self._discard(path, exc)
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
        evicted = self._evict_for(size)
        parsed = read_header(io.BytesIO(header))  # the exact header written, sha256 included
        self._remember(digest, _Record(parsed, size, _now_mtime(path)))
        return evicted

    def remove(self, key: StoreKey) -> bool:
        """Deletes the file for `key`; returns whether it existed."""
        digest = key.digest()
        known = self._forget(digest)
        try:
            self.path_for(key).unlink()
        except FileNotFoundError:
            return known
        return True

    def ls(self) -> list[DiskListing]:
        """Returns the entries this instance knows of, least recently used first."""
        return [DiskListing(r.header.key, r.header.n_tokens, r.header.positions, r.header.created, r.size,
                            r.mtime, self.directory / (digest + SUFFIX)) for digest, r in self._index.items()]

    def verify(self, *, delete: bool = False) -> list[BadFile]:
        """Returns the entry files that fail any check (payload checksums included).

        Args:
            delete: also delete the bad files (and forget them).
        """
        bad: list[BadFile] = []
        for path in self._entry_files():
            try:
                with open(path, "rb") as f:
                    header, _ = read_entry(f)
                _check_name(path, header)
            except CorruptEntryError as exc:
                bad.append(BadFile(path, exc.reason, str(exc)))
                if delete:
                    self._forget(path.stem)
                    path.unlink(missing_ok=True)
            except OSError as exc:
                bad.append(BadFile(path, "unreadable", str(exc)))
        return bad

    def clear(self) -> int:
        """Deletes every entry file and leftover temp file; returns how many entry files went."""
        removed = 0
        for path in self._entry_files():
            path.unlink(missing_ok=True)
            removed += 1
        for path in self.directory.glob("*" + _TEMP_SUFFIX):
            path.unlink(missing_ok=True)
        self._index.clear()
        self._used = 0
        return removed

    # -- helpers -------------------------------------------------------------------------------

    def _scan(self) -> None:
        """Indexes the existing files by mtime (oldest first); deletes those with a bad header."""
        found: list[tuple[int, str, _Record]] = []
        for path in self._entry_files():
            try:
                with open(path, "rb") as f:
                    header = read_header(f)
                    stat = os.fstat(f.fileno())
                _check_name(path, header)
            except CorruptEntryError as exc:
                self._discard(path, exc)
                continue
            except OSError as exc:
                log.warning("store file %s is unreadable (%s); skipping it", path, exc)
                continue
            found.append((stat.st_mtime_ns, path.name, _Record(header, stat.st_size, stat.st_mtime)))
        for _, name, record in sorted(found, key=lambda t: (t[0], t[1])):
            self._remember(name[: -len(SUFFIX)], record)

    def _entry_files(self) -> list[Path]:
        try:
            return sorted(p for p in self.directory.iterdir() if _ENTRY_NAME.match(p.name))
        except OSError as exc:
            raise StoreError(f"cannot list store directory {self.directory} ({exc.strerror}); "
                             f"{_DIRECTORY_FIX}") from exc

    def _write_atomically(self, path: Path, header: bytes, payload: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix="." + path.stem[:16] + ".", suffix=_TEMP_SUFFIX, dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write store file {path}: {exc}; free disk space, or "
                                 f"{_DIRECTORY_FIX}") from exc
            raise
        _fsync_directory(self.directory)

    def _evict_for(self, incoming: int) -> list[Evicted]:
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

    def _discard(self, path: Path, exc: CorruptEntryError) -> None:
        log.warning("store file %s is unusable (%s: %s); deleted it, the module will be re-encoded",
                    path, exc.reason, exc)
        self._forget(path.name[: -len(SUFFIX)])
        path.unlink(missing_ok=True)


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
