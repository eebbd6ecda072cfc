"""Tests of the payload framing of encodings saved in several state blobs (pc_cpu.kvstate.parts)."""

from __future__ import annotations

import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import parts


def test_one_blob_is_stored_unframed_so_older_payloads_read_the_same():
    blob = b"\x01\x00\x00\x00 a state blob"
    assert parts.pack([blob]) == blob
    assert parts.unpack(blob) == [blob]


def test_several_blobs_round_trip_in_order():
    blobs = [b"first", b"", b"third blob" * 100]
    assert parts.unpack(parts.pack(blobs)) == blobs


@pytest.mark.parametrize("cut", [8, 12, 20, -1])
def test_a_cut_payload_is_refused(cut):
    payload = parts.pack([b"first", b"second"])
    with pytest.raises(StateBlobError):
        parts.unpack(payload[:cut])


def test_a_payload_with_extra_bytes_or_an_absurd_count_is_refused():
    payload = parts.pack([b"first", b"second"])
    with pytest.raises(StateBlobError, match="add up"):
        parts.unpack(payload + b"x")
    with pytest.raises(StateBlobError, match="claims"):
        parts.unpack(parts.MAGIC + (1 << 30).to_bytes(4, "little"))
