"""Frames several state blobs as one store payload: how a sliding-window encoding is saved.

llama_state_seq_get_data leaves out the sliding-window cells that lie more than a
window behind the sequence's end, so an encoding spanning more than that is saved
as several blobs, each covering a span its window keeps whole (see
pc_cpu.engine.prompts.schema_cells). A payload of one blob is stored unframed, as every
payload was before parts existed, so older stores stay readable.

Layout (little-endian):

    magic     8 bytes        b"PCPARTS\\0"
    count     u32            number of blobs, at least 2
    lengths   count × u64    bytes of each blob
    blobs     the blobs, back to back
"""

from __future__ import annotations

import struct
from typing import Sequence

from pc_cpu.errors import StateBlobError

MAGIC = b"PCPARTS\0"
MAX_PARTS = 1 << 16  # an 8192-position context in 64-position windows needs 128; more means garbage
_HEAD = struct.Struct("<8sI")


def pack(blobs: Sequence[bytes]) -> bytes:
    """Returns one payload holding `blobs`: the blob itself when there is one, else framed."""
    if not blobs:
        raise ValueError("pack needs at least one blob")
    if len(blobs) == 1:
        return bytes(blobs[0])
    lengths = struct.pack(f"<{len(blobs)}Q", *(len(b) for b in blobs))
    return b"".join([_HEAD.pack(MAGIC, len(blobs)), lengths, *blobs])


def unpack(payload: bytes) -> list[bytes]:
    """Returns the blobs of a payload made by `pack`.

    Raises:
        StateBlobError: the framing is cut short or its lengths do not add up to the payload.
    """
    if not payload.startswith(MAGIC):
        return [payload]
    if len(payload) < _HEAD.size:
        raise StateBlobError(f"parts header cut at {len(payload)} bytes", code="truncated")
    _, count = _HEAD.unpack_from(payload)
    if not 2 <= count <= MAX_PARTS or len(payload) < _HEAD.size + 8 * count:
        raise StateBlobError(f"parts header claims {count} blobs in a {len(payload)}-byte payload", code="corrupt")
    lengths = struct.unpack_from(f"<{count}Q", payload, _HEAD.size)
    offset = _HEAD.size + 8 * count
    if offset + sum(lengths) != len(payload):
        raise StateBlobError(f"parts lengths add up to {sum(lengths)} bytes, the payload holds "
                             f"{len(payload) - offset}", code="corrupt")
    blobs = []
    for length in lengths:
        blobs.append(payload[offset:offset + length])
        offset += length
    return blobs
