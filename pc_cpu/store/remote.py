"""Tier 3: computed cells in a Redis (or Valkey) server that pc_cpu processes on several machines share.

The slowest tier, below RAM and disk (pc_cpu.store.tiers writes every new entry through to it and
reads it on a local miss, before anything is computed). What a second server needs to skip work
lives here under the same content keys as on disk: schema modules, documents with their stand-ins
and exact prefixes, conversation tips.

Layout (every name starts with NAMESPACE, then the disk format's version, so two pc_cpu versions
sharing one Redis never read each other's bytes; the model's fingerprint is part of each entry's
name, so two models never do either):

    <ns>e:<model>:<digest>            hash: meta (the disk file's header: key, tokens, positions,
                                      checksum), wid (the write that made it), n (chunks), size
    <ns>c:<model>:<digest>:<wid>:<i>  chunk i of the payload, CHUNK_BYTES at most (Redis caps one
                                      value at 512 MB; a 30K-token document's cells are more)
    <ns>lru                           sorted set: entry name -> its last use on <ns>clock, a counter
                                      every server's reads and writes advance: the LRU order
    <ns>bytes                         bytes of every entry (header + payload): the budget's count

A write puts its chunks first, under a name of its own and with an expiry, then one Lua script
(atomic on the server) checks they all arrived, makes them permanent, swaps the entry's hash to
them, deletes the chunks it replaced, and evicts least recently used entries until pc_cpu's bytes
fit `budget_bytes`: the eviction is ours, not Redis's `maxmemory-policy` (which would also evict
the document library). A writer killed half way leaves chunks that expire; a reader that meets an
entry replaced under it finds a chunk gone and misses.

Bytes from Redis are untrusted: the header's checksum, the payload's XXH3, the key and the cells
(pc_cpu.store.cells) are checked before anything reaches llama.cpp; a bad entry is logged,
deleted and a miss (the engine computes it again).

A read is abandoned when it takes longer than computing its cells would (`read_deadline_s`); a
server that fails a command is left alone for a pause (pc_cpu.store.redis_link.Link), so Redis
lost in the middle of serving costs speed, never an answer.
"""

from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from pc_cpu.errors import CorruptEntryError, EntryTooLargeError, StoreUnavailableError, UnknownEntryError
from pc_cpu.store.base import ByteBudget, Evicted
from pc_cpu.store.cells import check_cells
from pc_cpu.store.disk_format import FORMAT_VERSION, Header, check_key, checked_entry, encode_header, read_header
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey
from pc_cpu.store.redis_link import REMOTE_STORE_ENV, Link, connect, link_errors, redis_errors

log = logging.getLogger(__name__)
T = TypeVar("T")

NAMESPACE = f"pc_cpu:s{FORMAT_VERSION}:"
DEFAULT_REMOTE_BYTES = 8 * 1024**3  # 8 GiB of pc_cpu's keys: give the Redis server room for them
CHUNK_BYTES = 8 * 1024**2  # at 100 MB/s (a gigabit LAN) a chunk moves well inside COMMAND_TIMEOUT_S
# Chunks moved by one command (an MGET, a pipeline of SETs): 32 MB, a quarter of a second on a gigabit LAN, well
# inside COMMAND_TIMEOUT_S; a read's deadline is checked between them.
CHUNKS_PER_CALL = 4
PENDING_TTL_S = 600  # chunks of a write not yet committed expire: a killed writer leaves nothing for good
# The fastest prefill measured on a laptop CPU is ~500 tokens/s (SmolLM2-135M, 2 threads); a CPU four
# times faster computes FAST_PREFILL_TOKENS_S. A read slower than that would lose to computing the cells
# on any machine pc_cpu runs on: it is abandoned, and the cells are computed.
FAST_PREFILL_TOKENS_S = 2000
MIN_READ_S = 0.25  # a round trip or two on a slow link; below it a deadline only catches noise

_COMMIT = """
local ns, member, meta, wid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n, size, budget, now = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local function drop(name)
  local old = redis.call('HMGET', ns .. 'e:' .. name, 'wid', 'n', 'size', 'meta')
  if old[1] then
    for i = 0, (tonumber(old[2]) or 0) - 1 do redis.call('DEL', ns .. 'c:' .. name .. ':' .. old[1] .. ':' .. i) end
    redis.call('DEL', ns .. 'e:' .. name)
    redis.call('DECRBY', ns .. 'bytes', tonumber(old[3]) or 0)
  end
  redis.call('ZREM', ns .. 'lru', name)
  return old[4] or ''
end
for i = 0, n - 1 do
  if redis.call('PERSIST', ns .. 'c:' .. member .. ':' .. wid .. ':' .. i) == 0
     and redis.call('EXISTS', ns .. 'c:' .. member .. ':' .. wid .. ':' .. i) == 0 then
    for j = 0, n - 1 do redis.call('DEL', ns .. 'c:' .. member .. ':' .. wid .. ':' .. j) end
    return redis.error_reply('chunk ' .. i .. ' of the write is missing')
  end
end
drop(member)
redis.call('HSET', ns .. 'e:' .. member, 'meta', meta, 'wid', wid, 'n', n, 'size', size, 'used', now)
redis.call('ZADD', ns .. 'lru', redis.call('INCR', ns .. 'clock'), member)
local used = redis.call('INCRBY', ns .. 'bytes', size)
local evicted = {}
while used > budget do
  local oldest = redis.call('ZRANGE', ns .. 'lru', 0, 0)[1]
  if not oldest or oldest == member then break end
  evicted[#evicted + 1] = drop(oldest)
  used = tonumber(redis.call('GET', ns .. 'bytes'))
end
return evicted
"""

_TOUCH = """
local ns, name, now = ARGV[1], ARGV[2], ARGV[3]
if redis.call('ZADD', ns .. 'lru', 'XX', 'CH', redis.call('INCR', ns .. 'clock'), name) == 1 then
  redis.call('HSET', ns .. 'e:' .. name, 'used', now)
end
return 0
"""

_REMOVE = """
local ns, name = ARGV[1], ARGV[2]
local old = redis.call('HMGET', ns .. 'e:' .. name, 'wid', 'n', 'size')
redis.call('ZREM', ns .. 'lru', name)
if not old[1] then return 0 end
for i = 0, (tonumber(old[2]) or 0) - 1 do redis.call('DEL', ns .. 'c:' .. name .. ':' .. old[1] .. ':' .. i) end
redis.call('DEL', ns .. 'e:' .. name)
redis.call('DECRBY', ns .. 'bytes', tonumber(old[3]) or 0)
return 1
"""


def read_deadline_s(n_tokens: int) -> float:
    """Returns how long reading an entry of `n_tokens` cells may take before computing them would have been sooner."""
    return max(MIN_READ_S, n_tokens / FAST_PREFILL_TOKENS_S)


def entry_name(key: StoreKey) -> str:
    """Returns the name of `key`'s entry in Redis: the model's fingerprint, then the key's digest (its id in `ls`)."""
    return f"{key.model}:{key.digest()}"


@dataclass(frozen=True)
class RemoteListing:
    """One entry of the Redis tier, as `RemoteStore.ls` reports it."""

    key: StoreKey
    n_tokens: int
    positions: tuple[int, int]  # [start, end)
    created: float  # unix seconds the cells were computed
    size_bytes: int  # header + payload
    last_used: float  # unix seconds
    id: str  # the key's digest, as `pc-cpu store ls` shows it


@dataclass(frozen=True)
class BadEntry:
    """An entry of the Redis tier that failed its checks, as `RemoteStore.verify` reports it."""

    id: str
    reason: str  # CorruptEntryError.reason ("checksum", "cells", ...) or "missing" (a chunk is gone)
    message: str
    deleted: bool = False


class RemoteStore(ByteBudget):
    """Entries in a shared Redis server, LRU within a byte budget that every server sharing it counts together."""

    def __init__(self, url: str, *, budget_bytes: int = DEFAULT_REMOTE_BYTES, name: str = "remote", client=None):
        """Opens the tier on the Redis at `url` (redis://, rediss://, unix://); nothing is sent until it is used.

        `client`: a redis-py client to use instead of one opened from `url` (tests).
        """
        if budget_bytes < 0:
            raise ValueError(f"remote store budget must be >= 0 bytes, got {budget_bytes}")
        self.name = name
        self.url = url
        self.link = Link(url)
        self._client = client if client is not None else connect(url)
        self._budget = budget_bytes
        self._used = 0  # the shared count as last read (bytes_used reads it again)
        self._commit = self._client.register_script(_COMMIT)
        self._remove = self._client.register_script(_REMOVE)
        self._touch = self._client.register_script(_TOUCH)

    @property
    def shown(self) -> str:
        """Returns the server's URL as messages show it (no password)."""
        return self.link.shown

    def check_reachable(self) -> None:
        """Raises StoreUnavailableError naming the server, and what to do, unless it answers a PING now."""
        import redis

        try:
            self._client.ping()
        except (redis.AuthenticationError, redis.ResponseError) as exc:
            # The server answered, and said no: a wrong password or user, or a database it does not have.
            raise StoreUnavailableError(f"the shared store {self.shown} refused pc_cpu ({exc}); fix the URL's user, "
                                        f"password or database (--remote-store, ${REMOTE_STORE_ENV})") from None
        except link_errors() as exc:
            raise StoreUnavailableError(
                f"the shared store {self.shown} cannot be reached ({exc}); start it or fix the URL (--remote-store, "
                f"${REMOTE_STORE_ENV}), or pass --store-fallback local (store_fallback=\"local\") to serve from "
                "the local tiers until it is back") from None

    def start_down(self, exc: StoreUnavailableError) -> None:
        """Serves from the local tiers, trying the server again after a pause: it did not answer at start."""
        self.link.failed("opening the shared tier", exc)

    def library_shelf(self):
        """Returns the document library's shelf in this Redis (pc_cpu.store.shared_library), sharing this tier's link."""
        from pc_cpu.store.shared_library import RedisShelf

        return RedisShelf(self._client, self.link)

    def close(self) -> None:
        """Closes the client's connections."""
        self._client.close()

    @property
    def bytes_used(self) -> int:
        """Returns the bytes every server's entries take in Redis now (the last count read, while it is down)."""
        value = self._call("counting its bytes", lambda: self._client.get(NAMESPACE + "bytes"), None)
        if value is not None:
            self._used = int(value)
        return self._used

    def __len__(self) -> int:
        return self._call("counting its entries", lambda: self._client.zcard(NAMESPACE + "lru"), 0)

    # --- the tier interface (pc_cpu.store.base.ModuleStore) ------------------------------------

    def contains(self, key: StoreKey) -> bool:
        """Returns whether Redis holds `key` (False while it is down), without touching its LRU position."""
        return bool(self._call("looking up an entry", lambda: self._client.exists(NAMESPACE + "e:" + entry_name(key)), 0))

    def get(self, key: StoreKey) -> Entry | None:
        """Returns the checked entry for `key` and marks it most recently used; None on a miss, a bad entry or a slow read."""
        name = entry_name(key)
        try:
            return self._call("reading an entry", lambda: self._read(key, name), None)
        except CorruptEntryError as exc:
            self._drop_bad(name, key.describe(), exc)
            return None

    def put(self, key: StoreKey, entry: Entry) -> list[Evicted]:
        """Writes `entry` (chunks, then one atomic commit); returns what the commit evicted (entry None).

        While the server is down, or when it refuses the write (out of memory), nothing is written
        and the entry stays in the local tiers (logged).

        Raises:
            EntryTooLargeError: header and payload are more than the whole budget.
        """
        header = encode_header(key, entry)
        size = len(header) + entry.nbytes
        if size > self._budget:
            raise EntryTooLargeError(f"{key.describe()}: {size} bytes > {self.name} budget of {self._budget} bytes; "
                                     f"raise the {self.name} budget (--remote-bytes)")
        name = entry_name(key)
        evicted = self._call("writing an entry", lambda: self._write(name, header, entry.payload, size), None)
        if evicted is None:
            log.debug("%s: %s not written to %s", self.name, key.describe(), self.shown)
            return []
        return [Evicted(_evicted_key(meta), None) for meta in evicted]

    def remove(self, key: StoreKey) -> bool:
        """Deletes `key`'s entry; returns whether it was there (False, and it stays, while the server is down)."""
        return bool(self._call("removing an entry", lambda: self._remove(args=[NAMESPACE, entry_name(key)]), 0))

    # --- what `pc-cpu store` and the document library need ---------------------------------------

    def keys(self) -> list[StoreKey]:
        """Returns the keys held, least recently used first.

        Raises:
            StoreUnavailableError: the server cannot be reached.
        """
        return [item.key for item in self.ls()]

    def ls(self) -> list[RemoteListing]:
        """Returns every entry, least recently used first (headers only; payloads are not read).

        Raises:
            StoreUnavailableError: the server cannot be reached.
        """
        return self.link.require("listing the shared tier", self._ls)

    def entry_with_id(self, prefix: str) -> RemoteListing:
        """Returns the one entry whose id (as `ls` shows it) starts with `prefix`.

        Raises:
            UnknownEntryError: no entry, or several, has such an id.
        """
        matches = [item for item in self.ls() if item.id.startswith(prefix)] if prefix else []
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise UnknownEntryError(f"id {prefix!r} matches {len(matches)} entries of {self.shown}; give a longer "
                                    "prefix from `pc-cpu store ls`", matches=len(matches))
        raise UnknownEntryError(f"no entry of {self.shown} has id {prefix!r}")

    def verify(self, *, delete: bool = False) -> list[BadEntry]:
        """Returns every entry that fails its checks (every payload is read); deletes them when `delete`.

        Raises:
            StoreUnavailableError: the server cannot be reached.
        """
        return self.link.require("verifying the shared tier", lambda: self._verify(delete))

    def clear(self) -> int:
        """Deletes every entry of this pc_cpu version (other versions' and the document library are left); returns how many.

        Raises:
            StoreUnavailableError: the server cannot be reached.
        """
        return self.link.require("clearing the shared tier", self._clear)

    # --- helpers -----------------------------------------------------------------------------

    def _call(self, what: str, command: Callable[[], T], default: T) -> T:
        """Returns `command()` through the link (`default` while the server is down); a refusal is logged, `default`.

        A refusal is the server answering with an error: out of memory under `maxmemory`, or a
        value of another type under one of pc_cpu's names. The entry then stays local.
        """
        try:
            return self.link.call(what, command, default)
        except redis_errors() as exc:
            log.warning("%s: %s refused %s (%s); the local tiers keep serving", self.name, self.shown, what, exc)
            return default

    def _read(self, key: StoreKey, name: str) -> Entry | None:
        started = time.monotonic()
        meta, wid, n = self._client.hmget(NAMESPACE + "e:" + name, "meta", "wid", "n")
        if meta is None:
            return None
        header = _header(meta)
        check_key(header, key)
        deadline = started + read_deadline_s(header.n_tokens)
        chunk_names = _chunk_names(name, wid, n)
        chunks: list[bytes] = []
        for first in range(0, len(chunk_names), CHUNKS_PER_CALL):
            if time.monotonic() > deadline:
                log.warning("%s: reading %s from %s took more than %.2f s, longer than computing it; computing it",
                            self.name, key.describe(), self.shown, read_deadline_s(header.n_tokens))
                return None
            got = self._client.mget(chunk_names[first:first + CHUNKS_PER_CALL])
            if any(chunk is None for chunk in got):
                return None  # replaced or evicted since the header was read: a miss, not damage
            chunks.extend(got)
        entry = checked_entry(header, b"".join(chunks))
        check_cells(entry)
        self._touch(args=[NAMESPACE, name, _now_ms()])
        return entry

    def _write(self, name: str, header: bytes, payload: bytes, size: int) -> list[bytes]:
        wid = os.urandom(6).hex()
        view = memoryview(payload)
        starts = range(0, max(len(view), 1), CHUNK_BYTES)
        for first in range(0, len(starts), CHUNKS_PER_CALL):
            pipe = self._client.pipeline(transaction=False)
            for i in range(first, min(first + CHUNKS_PER_CALL, len(starts))):
                chunk = view[starts[i]:starts[i] + CHUNK_BYTES].tobytes()
                pipe.set(f"{NAMESPACE}c:{name}:{wid}:{i}", chunk, ex=PENDING_TTL_S)
            pipe.execute()
        n = len(starts)
        return self._commit(args=[NAMESPACE, name, header, wid, n, size, self._budget, _now_ms()])

    def _ls(self) -> list[RemoteListing]:
        members = self._client.zrange(NAMESPACE + "lru", 0, -1)
        pipe = self._client.pipeline(transaction=False)
        for member in members:
            pipe.hmget(NAMESPACE + "e:" + member.decode(), "meta", "size", "used")
        listing = []
        for member, (meta, size, used) in zip(members, pipe.execute()):
            if meta is None:
                continue  # removed since the listing
            try:
                header = _header(meta)
            except CorruptEntryError:
                continue  # `verify` names it
            listing.append(RemoteListing(header.key, header.n_tokens, header.positions, header.created, int(size),
                                         int(used or 0) / 1000, member.decode().rsplit(":", 1)[-1]))
        return listing

    def _verify(self, delete: bool) -> list[BadEntry]:
        bad = []
        for member in self._client.zrange(NAMESPACE + "lru", 0, -1):
            name = member.decode()
            meta, wid, n = self._client.hmget(NAMESPACE + "e:" + name, "meta", "wid", "n")
            if meta is None:
                continue
            try:
                header = _header(meta)
                chunks = self._client.mget(_chunk_names(name, wid, n))
                if any(chunk is None for chunk in chunks):
                    raise CorruptEntryError("a chunk of its payload is gone", reason="missing")
                if header.key.digest() != name.rsplit(":", 1)[-1]:
                    raise CorruptEntryError(f"it holds {header.key.describe()}, whose digest is not its name",
                                            reason="foreign_key")
                check_cells(checked_entry(header, b"".join(chunks)))
            except CorruptEntryError as exc:
                deleted = self._delete_bad(name) if delete else False
                bad.append(BadEntry(name.rsplit(":", 1)[-1], exc.reason, str(exc), deleted))
        return bad

    def _clear(self) -> int:
        count = self._client.zcard(NAMESPACE + "lru")
        names = list(self._client.scan_iter(match=NAMESPACE + "*", count=1000))
        for first in range(0, len(names), 1000):
            self._client.delete(*names[first:first + 1000])
        return count

    def _delete_bad(self, name: str) -> bool:
        """Deletes an entry that failed its checks, and every chunk under its name (its fields may not say which)."""
        removed = bool(self._remove(args=[NAMESPACE, name]))
        leftovers = list(self._client.scan_iter(match=f"{NAMESPACE}c:{name}:*", count=1000))
        if leftovers:
            self._client.delete(*leftovers)
        return removed

    def _drop_bad(self, name: str, described: str, exc: CorruptEntryError) -> None:
        removed = self._call("removing a bad entry", lambda: self._delete_bad(name), False)
        log.warning("%s: entry %s in %s is unusable (%s: %s); %s, the cells will be computed again", self.name,
                    described, self.shown, exc.reason, exc, "deleted it" if removed else "could not delete it")


def _header(meta: bytes) -> Header:
    """Returns the header Redis holds for an entry; raises CorruptEntryError when it is not one whole header."""
    f = io.BytesIO(meta)
    header = read_header(f)
    if f.read(1):
        raise CorruptEntryError("the entry's header has bytes after it", reason="corrupt")
    return header


def _chunk_names(name: str, wid: bytes | None, n: bytes | None) -> list[str]:
    """Returns the names of an entry's payload chunks; raises CorruptEntryError when its fields are not pc_cpu's."""
    if wid is None or n is None or not n.isdigit() or not 0 < int(n) <= 1 << 16 or not wid.isalnum():
        raise CorruptEntryError("the entry's fields are not the ones pc_cpu writes", reason="corrupt")
    return [f"{NAMESPACE}c:{name}:{wid.decode()}:{i}" for i in range(int(n))]


def _evicted_key(meta: bytes) -> StoreKey:
    """Returns the key of an entry the commit evicted, read from its header (a stand-in when the header is bad)."""
    try:
        return _header(meta).key
    except CorruptEntryError:
        return StoreKey("?", "?", "evicted", label="an unreadable entry")


def _now_ms() -> int:
    return int(time.time() * 1000)
