"""Joining several module blobs into one restore blob.

state_blob.splice is the numpy building block of the numpy assemble_into (the C library joins
inside pc_state_assemble, held to the numpy bytes by tests/native/test_assemble.py). The "cached
equals fresh" check here runs both implementations' assembly without moves, as restore_blob
does: one llama_state_seq_set_data of the joined blob gives the same sequence (cells, bytes,
next-token logits) as restoring each blob into a staging sequence and sharing it with
llama_memory_seq_cp, in a context with the same cell layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import state_blob

from .conftest import SUFFIX, BlobSpec, assemble, make_blob


def _v_elements(blob: bytes) -> np.ndarray:
    """Transposed V of layer 0 of a synthetic 2-layer F16 blob as (n_embd, n_cell) uint16."""
    info = state_blob.scan(blob)
    n, n_embd = info.n_cell, info.v_row_size // 2
    off = 8 + 8 + n * 12 + 8 + 2 * (12 + n * info.k_row_size) + 12
    return np.frombuffer(blob, "<u2", n * n_embd, off).reshape(n_embd, n)


@pytest.mark.parametrize("v_trans", [False, True], ids=["v_rows", "v_trans"])
def test_splice_concatenates_cells_and_rows(v_trans):
    a = make_blob(BlobSpec(positions=(0, 1, 2), seq_id=1, v_trans=v_trans, seed=1))
    b = make_blob(BlobSpec(positions=(7, 8), seq_id=2, v_trans=v_trans, seed=2))
    out = state_blob.splice([a, b])
    info = state_blob.scan(out)
    assert (info.seq_id, info.n_cell, info.pos_min, info.pos_max) == (1, 5, 0, 8)
    assert len(out) == len(a) + len(b) - 8 - 8 - 8 - 4 * 12
    if v_trans:  # element j of every cell, in cell order: a's cells then b's
        assert np.array_equal(_v_elements(out), np.hstack([_v_elements(a), _v_elements(b)]))


def test_splice_of_one_blob_is_that_blob():
    blob = make_blob(BlobSpec(n_stream=3, stream=1, ext=True, n_section=2))
    assert bytes(state_blob.splice([blob])) == blob


def test_splice_skips_empty_blobs():
    empty = make_blob(BlobSpec(positions=(), seq_id=4, n_stream=2))
    full = make_blob(BlobSpec(positions=(5,), seq_id=1, n_stream=2, stream=1))
    out = state_blob.splice([empty, full])
    # blob 0's seq id, the cells in the stream where the first non-empty blob had them
    assert bytes(out) == make_blob(BlobSpec(positions=(5,), seq_id=4, n_stream=2, stream=1))
    assert state_blob.scan(state_blob.splice([empty, empty])).n_cell == 0


@pytest.mark.parametrize("other, code", [
    (BlobSpec(positions=(2, 3)), "overlap"),
    (BlobSpec(positions=(5,), v_trans=True), "mismatch"),
    (BlobSpec(positions=(5,), n_layer=3), "mismatch"),
    (BlobSpec(positions=(5,), head_dim=4), "mismatch"),
    (BlobSpec(positions=(5,), n_stream=2), "mismatch"),
    (BlobSpec(positions=(5,), ext=True), "mismatch"),
    (BlobSpec(positions=(5,), n_section=2), "mismatch"),
], ids=["overlap", "v_trans", "n_layer", "row_size", "n_stream", "ext", "n_section"])
def test_splice_refuses_incompatible_blobs(other, code):
    with pytest.raises(StateBlobError) as e:
        state_blob.splice([make_blob(BlobSpec(positions=(0, 1, 2))), make_blob(other)])
    assert e.value.code == code


def test_splice_names_the_bad_blob():
    good = make_blob()
    with pytest.raises(StateBlobError, match="blob 1 of 2") as e:
        state_blob.splice([good, good[:-3]])
    assert e.value.code == "truncated"
    with pytest.raises(StateBlobError) as e:
        state_blob.splice([])
    assert e.value.code == "argument"


def test_spliced_restore_equals_staging_and_seq_cp(impl, real_blobs, rig_factory, smollm2):
    """One set_data of the joined [a, b] == set_data(a), set_data(b) into staging + seq_cp."""
    rig = rig_factory(flash_attn=real_blobs.flash_attn)
    suffix = smollm2.tokens(SUFFIX)
    n = real_blobs.n_a + real_blobs.n_b

    rig.set(5, assemble(impl, [real_blobs.a, real_blobs.b], [0, 0], None, _streams(real_blobs.a)))
    spliced_state, spliced_range = rig.get(5), rig.pos_range(5)
    spliced_logits = rig.decode(suffix, n, 5)

    rig.clear()
    rig.set(6, real_blobs.a)
    rig.set(7, real_blobs.b)
    rig.seq_cp(6, 5)
    rig.seq_cp(7, 5)
    staged_state, staged_range = rig.get(5), rig.pos_range(5)
    staged_logits = rig.decode(suffix, n, 5)

    assert spliced_range == staged_range == (0, n - 1)
    assert spliced_state == staged_state
    assert np.array_equal(spliced_logits, staged_logits)


def test_spliced_blob_in_any_order_restores(impl, real_blobs, rig_factory, smollm2):
    """Cells need not be in position order: b's cells first, then a's, restore and decode."""
    rig = rig_factory(flash_attn=real_blobs.flash_attn)
    n = real_blobs.n_a + real_blobs.n_b
    rig.set(3, assemble(impl, [real_blobs.b, real_blobs.a], [0, 0], None, _streams(real_blobs.a)))
    assert rig.pos_range(3) == (0, n - 1)
    assert impl.scan(rig.get(3)).n_cell == n
    logits = rig.decode(smollm2.tokens(SUFFIX), n, 3)
    assert np.isfinite(logits).all()


def _streams(blob) -> int:
    """Returns the stream count of the context a real blob came from (the rig restores into the same)."""
    return state_blob.scan(blob).n_stream
