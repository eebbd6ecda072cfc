"""The byte layout of one disk store file: a checksummed header, then the state payload.

Layout (little-endian):

    magic        8 bytes   b"PCSTORE\\0"
    version      u32       FORMAT_VERSION
    meta_len     u32       bytes of the JSON header that follows (at most MAX_META_BYTES)
    meta_sha256  32 bytes  sha256 of the JSON header, so no header field can rot unnoticed
    meta         meta_len  UTF-8 JSON: key fields, n_tokens, pos_start, pos_end, created,
                           payload_len, and the payload's checksum: payload_xxh3_128 (hex; files
                           written before 2026-12-05 have payload_sha256, and still read)
    payload      payload_len bytes, opaque (llama_state_seq_get_data output)

Readers raise CorruptEntryError for anything else; they never trust a length before bounding it.
The payload's checksum guards against rot and cut writes, not against someone who can write the
store (they could write a matching checksum of any kind): XXH3-128 hashes the ~100 MB of a long
document's cells in ~8 ms, where sha256 took ~70 ms of a disk hit's time to first token.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable

import xxhash

from pc_cpu.errors import CorruptEntryError
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey

MAGIC = b"PCSTORE\0"
LEGACY_CONTENT_PREFIX = "schema:"  # the content of a file keyed by schema text (before content keys): never matched
FORMAT_VERSION = 1
MAX_META_BYTES = 64 * 1024  # a header is a few hundred bytes; more means garbage
_FIXED = struct.Struct("<8sII32s")  # magic, version, meta_len (bytes), sha256(meta)
# The payload's checksum by its header field: the first is written, every one is read.
PAYLOAD_CHECKSUMS: dict[str, Callable[[bytes], str]] = {
    "payload_xxh3_128": xxhash.xxh3_128_hexdigest,
    "payload_sha256": lambda payload: hashlib.sha256(payload).hexdigest(),
}
WRITTEN_CHECKSUM = "payload_xxh3_128"


@dataclass(frozen=True)
class Header:
    """What a store file says about its payload, read without reading the payload."""

    key: StoreKey
    n_tokens: int
    positions: tuple[int, int]  # [start, end)
    created: float  # unix seconds
    payload_len: int  # bytes
    checksum: tuple[str, str]  # (its PAYLOAD_CHECKSUMS field, hex digest)
    header_len: int  # bytes before the payload

    def payload_matches(self, payload: bytes) -> bool:
        """Returns whether `payload` has the checksum this header records."""
        field, digest = self.checksum
        return PAYLOAD_CHECKSUMS[field](payload) == digest


def encode_header(key: StoreKey, entry: Entry) -> bytes:
    """Returns the header bytes (fixed part + JSON meta) that precede `entry.payload` on disk."""
    meta = {
        "model": key.model, "content": key.content, "mode": key.mode, "label": key.label,
        "n_tokens": entry.n_tokens, "pos_start": entry.positions[0], "pos_end": entry.positions[1],
        "created": entry.created, "payload_len": entry.nbytes,
        WRITTEN_CHECKSUM: PAYLOAD_CHECKSUMS[WRITTEN_CHECKSUM](entry.payload),
    }
    meta_bytes = json.dumps(meta, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return _FIXED.pack(MAGIC, FORMAT_VERSION, len(meta_bytes), hashlib.sha256(meta_bytes).digest()) + meta_bytes


def read_header(f: BinaryIO) -> Header:
    """Returns the header of the file open at offset 0, leaving `f` at the payload.

    Raises:
        CorruptEntryError: bad magic, another format version, or a malformed header.
    """
    fixed = f.read(_FIXED.size)
    if len(fixed) < _FIXED.size:
        raise CorruptEntryError(f"file is {len(fixed)} bytes, shorter than the {_FIXED.size}-byte header",
                                reason="truncated")
    magic, version, meta_len, meta_sha256 = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise CorruptEntryError(f"magic {magic!r} is not {MAGIC!r}: not a pc_cpu store file", reason="bad_magic")
    if version != FORMAT_VERSION:
        raise CorruptEntryError(f"format version {version}, this pc_cpu reads {FORMAT_VERSION}",
                                reason="version")
    if meta_len > MAX_META_BYTES:
        raise CorruptEntryError(f"header claims {meta_len} bytes > {MAX_META_BYTES}", reason="corrupt")
    raw = f.read(meta_len)
    if len(raw) < meta_len:
        raise CorruptEntryError(f"header cut at {len(raw)} of {meta_len} bytes", reason="truncated")
    if hashlib.sha256(raw).digest() != meta_sha256:
        raise CorruptEntryError("header sha256 does not match the header", reason="checksum")
    return _parse_meta(raw, header_len=_FIXED.size + meta_len)


def _parse_meta(raw: bytes, *, header_len: int) -> Header:
    try:
        meta = json.loads(raw.decode("utf-8"))
        if "content" not in meta and "schema_hash" in meta:  # written before content keys: listed, never matched
            meta = {**meta, "content": LEGACY_CONTENT_PREFIX + meta["schema_hash"], "label": meta.get("module", "")}
        checksum_field = next(field for field in PAYLOAD_CHECKSUMS if field in meta)
        strings = [meta[k] for k in ("model", "content", "mode", "label", checksum_field)]
        ints = [meta[k] for k in ("n_tokens", "pos_start", "pos_end", "payload_len")]
        created = meta["created"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, StopIteration) as exc:
        raise CorruptEntryError(f"header is not the expected JSON ({exc})", reason="corrupt") from None
    if not all(isinstance(s, str) for s in strings) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ints) or not isinstance(
            created, (int, float)) or ints[1] > ints[2]:
        raise CorruptEntryError("header fields have the wrong types or ranges", reason="corrupt")
    model, content, mode, label, digest = strings
    n_tokens, start, end, payload_len = ints
    return Header(StoreKey(model, content, mode, label), n_tokens, (start, end), float(created),
                  payload_len, (checksum_field, digest), header_len)


def read_entry(f: BinaryIO, expected: StoreKey | None = None) -> tuple[Header, Entry]:
    """Returns the header and entry of the file open at offset 0, all of it checked.

    Args:
        f: the file, opened for binary reading.
        expected: the key the caller looked up; a file holding another key is rejected.

    Raises:
        CorruptEntryError: any mismatch of magic, version, key, length or checksum.
    """
    header = read_header(f)
    check_key(header, expected)
    here = f.tell()
    remaining = f.seek(0, 2) - here  # check the claimed length before trusting it with a read
    f.seek(here)
    if remaining != header.payload_len:
        raise CorruptEntryError(f"payload is {remaining} bytes, header says {header.payload_len}",
                                reason="truncated" if remaining < header.payload_len else "corrupt")
    payload = f.read(remaining)
    if len(payload) != remaining:
        raise CorruptEntryError(f"payload read stopped at {len(payload)} of {remaining} bytes", reason="truncated")
    return header, checked_entry(header, payload)


def check_key(header: Header, expected: StoreKey | None) -> None:
    """Raises CorruptEntryError (reason "foreign_key") when the header holds a key other than `expected` (None: any)."""
    if expected is not None and header.key != expected:
        raise CorruptEntryError(f"entry holds {header.key.describe()}, not {expected.describe()}",
                                reason="foreign_key")


def checked_entry(header: Header, payload: bytes) -> Entry:
    """Returns the entry of `header` and `payload` once the payload has the header's length and checksum.

    Every tier that keeps a header beside its payload reads through here (a file, a Redis entry).

    Raises:
        CorruptEntryError: the payload's length or checksum is not the header's.
    """
    if len(payload) != header.payload_len:
        raise CorruptEntryError(f"payload is {len(payload)} bytes, header says {header.payload_len}",
                                reason="truncated" if len(payload) < header.payload_len else "corrupt")
    if not header.payload_matches(payload):
        raise CorruptEntryError(f"payload checksum ({header.checksum[0]}) does not match the header",
                                reason="checksum")
    return Entry(payload, header.n_tokens, header.positions, header.created)
