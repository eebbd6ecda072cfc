"""order_by_position and restream: what moving an assembled prompt into its own stream does to its bytes."""

from __future__ import annotations

import pytest

from pc_cpu.kvstate import state_blob
from tests.native.conftest import BlobSpec, make_blob


def kv_by_position(blob, layer: int = 1, section: int = 0) -> dict[int, tuple[bytes, bytes]]:
    """Returns each cell's K and V values (as bytes: random V bytes may hold NaNs) by position."""
    pos, k, v = state_blob.layer_kv(blob, layer, section=section)
    return {int(p): (k[i].tobytes(), v[i].tobytes()) for i, p in enumerate(pos)}


@pytest.mark.parametrize("v_trans", [False, True])
def test_cells_are_sorted_with_their_own_k_and_v(v_trans):
    blob = make_blob(BlobSpec(positions=(7, 2, 9, 0, 4), v_trans=v_trans, n_section=2))
    ordered = state_blob.order_by_position(blob)
    for section in (0, 1):
        pos, _, _ = state_blob.layer_kv(ordered, 0, section=section)
        assert pos.tolist() == [0, 2, 4, 7, 9]
        assert kv_by_position(ordered, section=section) == kv_by_position(blob, section=section)
    assert len(ordered) == len(blob)


def test_a_sorted_blob_is_returned_uncopied():
    blob = make_blob(BlobSpec(positions=(1, 3, 8)))
    assert state_blob.order_by_position(blob) is blob


def test_two_cells_at_one_position_cannot_be_ordered():
    with pytest.raises(state_blob.StateBlobError):
        state_blob.order_by_position(make_blob(BlobSpec(positions=(3, 1, 3))))


def test_restream_moves_the_cells_into_a_context_of_more_streams_unchanged():
    blob = make_blob(BlobSpec(positions=(5, 6, 7), n_section=2, v_trans=True))
    wide = state_blob.restream(blob, 4)
    info = state_blob.scan(wide)
    assert info.n_stream == 4 and info.n_section == 2 and info.n_cell == 3
    assert kv_by_position(wide) == kv_by_position(blob)
    assert bytes(state_blob.restream(wide, 1)) == bytes(blob)  # and back, byte for byte


@pytest.mark.parametrize("n_section", [1, 2])
def test_restream_in_place_gives_restreams_bytes(n_section):
    blob = make_blob(BlobSpec(positions=(5, 6, 7), n_section=n_section))
    expected = bytes(state_blob.restream(blob, 5))
    buf = bytearray(blob)
    out = state_blob.restream_in_place(buf, 5)
    assert bytes(out) == expected
    assert (out is buf) == (n_section == 1)  # one cache: no copy; two: restream's copy
    assert bytes(state_blob.restream_in_place(bytearray(blob), 1)) == bytes(blob)
