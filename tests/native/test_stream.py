"""restream() and order_in_place(): fitting a blob to the prompt stream it is restored into.

Every schema prompt runs both (pc_cpu.engine.cells.streams.move_to_stream), so the C twin
(native/pc_stream.c) must give the numpy reference's bytes, or its error code, for any blob.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, state_blob

from .conftest import GGML_F16, GGML_F32, BlobSpec, make_blob, outcome, sorted_in_place

needs_native = pytest.mark.skipif(not native.available(), reason="libpc_native not built")


SPECS = st.builds(
    BlobSpec,
    positions=st.lists(st.integers(0, 40), max_size=12).map(tuple),  # duplicates too: refused alike
    seq_id=st.integers(0, 3), n_layer=st.integers(0, 3), n_head_kv=st.integers(1, 2),
    head_dim=st.sampled_from([2, 4, 6]), k_type=st.sampled_from([GGML_F16, GGML_F32]),
    v_type=st.sampled_from([GGML_F16, GGML_F32]), v_trans=st.booleans(), n_stream=st.integers(1, 3),
    stream=st.integers(0, 2), ext=st.booleans(), n_section=st.integers(1, 2), seed=st.integers(0, 9))


@needs_native
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS, n_stream=st.integers(0, 5))
def test_numpy_and_native_agree_on_generated_blobs(spec, n_stream):
    blob = make_blob(dataclasses.replace(spec, stream=min(spec.stream, spec.n_stream - 1)))
    assert outcome(native.restream, blob, n_stream) == outcome(state_blob.restream, blob, n_stream)
    assert outcome(sorted_in_place, native, blob) == outcome(sorted_in_place, state_blob, blob)


@needs_native
def test_numpy_and_native_agree_on_real_blobs(real_blobs):
    a, b = real_blobs.a, real_blobs.b
    for blob in (a, b, bytes(state_blob.splice([b, a])), bytes(state_blob.restream(state_blob.splice([b, a]), 8))):
        for n_stream in (1, 2, 8):
            assert bytes(native.restream(blob, n_stream)) == bytes(state_blob.restream(blob, n_stream))
        assert sorted_in_place(native, blob) == sorted_in_place(state_blob, blob)


def test_ordering_cells_spliced_out_of_order_gives_the_splice_in_order(impl, real_blobs):
    a, b = real_blobs.a, real_blobs.b  # a at [0, n_a), b right after it
    ordered = sorted_in_place(impl, state_blob.splice([b, a]))
    assert ordered == bytes(state_blob.with_sequence(state_blob.splice([a, b]), state_blob.scan(b).seq_id))


@pytest.mark.parametrize("v_trans", [False, True], ids=["v_rows", "v_trans"])
def test_cells_are_sorted_with_their_own_k_and_v(impl, v_trans):
    blob = make_blob(BlobSpec(positions=(7, 2, 9, 0, 4), v_trans=v_trans, n_section=2))
    ordered = sorted_in_place(impl, blob)
    for section in (0, 1):
        assert state_blob.layer_kv(ordered, 0, section=section)[0].tolist() == [0, 2, 4, 7, 9]
        assert _kv_by_position(ordered, section) == _kv_by_position(blob, section)
    assert len(ordered) == len(blob)


def _kv_by_position(blob, section: int) -> dict[int, tuple[bytes, bytes]]:
    """Each cell's K and V of layer 1 (as bytes: random V bytes may hold NaNs), by position."""
    pos, k, v = state_blob.layer_kv(blob, 1, section=section)
    return {int(p): (k[i].tobytes(), v[i].tobytes()) for i, p in enumerate(pos)}


def test_a_blob_in_order_is_left_as_it_is(impl):
    for blob in (make_blob(BlobSpec(positions=(1, 3, 8), n_section=2)), make_blob(BlobSpec(positions=()))):
        assert sorted_in_place(impl, blob) == blob


@pytest.mark.parametrize("positions", [(3, 1, 3), (1, 3, 3)], ids=["out_of_order", "in_order"])
def test_two_cells_at_one_position_cannot_be_ordered(impl, positions):
    with pytest.raises(StateBlobError) as e:
        sorted_in_place(impl, make_blob(BlobSpec(positions=positions)))
    assert e.value.code == "overlap"


def test_restream_moves_the_cells_into_a_context_of_more_streams_unchanged(impl):
    blob = make_blob(BlobSpec(positions=(5, 6, 7), n_section=2, v_trans=True))
    wide = impl.restream(blob, 4)
    info = state_blob.scan(wide)
    assert (info.n_stream, info.n_section, info.n_cell) == (4, 2, 3)
    assert len(wide) == len(blob) + 2 * 4 * 3
    assert _kv_by_position(wide, 1) == _kv_by_position(blob, 1)
    assert bytes(impl.restream(wide, 1)) == blob  # and back, byte for byte


def test_restream_puts_the_cells_of_any_stream_in_the_first(impl):
    blob = make_blob(BlobSpec(positions=(2, 3), n_stream=3, stream=2, ext=True))
    assert bytes(impl.restream(blob, 2)) == make_blob(BlobSpec(positions=(2, 3), n_stream=2, stream=0, ext=True))


@pytest.mark.parametrize("n_stream", [0, 257, -1])
def test_restream_refuses_a_stream_count_llama_cpp_cannot_have(impl, n_stream):
    with pytest.raises(StateBlobError) as e:
        impl.restream(b"not even a blob", n_stream)  # the count is judged first
    assert e.value.code == "argument"


def test_restream_and_order_name_a_malformed_blob(impl):
    with pytest.raises(StateBlobError) as e:
        impl.restream(make_blob()[:-1], 2)
    assert e.value.code == "truncated"
    with pytest.raises(StateBlobError) as e:
        sorted_in_place(impl, b"\x00" * 16)
    assert e.value.code == "bad_magic"


def test_order_in_place_sorts_the_buffer_it_is_given(impl):
    blob = make_blob(BlobSpec(positions=(7, 2, 9, 0, 4), v_trans=True, n_section=2))
    buf = bytearray(blob)
    view = memoryview(buf)[:len(blob)]  # as move_to_stream passes a slice of its reused buffer
    impl.order_in_place(view)
    del view
    assert bytes(buf) == sorted_in_place(state_blob, blob) != blob


def test_order_in_place_refuses_what_it_cannot_write_or_order(impl):
    for blob, code in ((make_blob(), "argument"), (bytearray(make_blob(BlobSpec(positions=(3, 1, 3)))), "overlap"),
                       (bytearray(make_blob()[:-1]), "truncated")):
        before = bytes(blob)
        with pytest.raises(StateBlobError) as e:
            impl.order_in_place(blob)
        assert e.value.code == code and bytes(blob) == before
