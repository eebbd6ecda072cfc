"""assemble_into(): blobs moved and spliced into one restore blob in one pass (pc_state_assemble).

Its bytes must be those of the three steps it replaces: relocate each moved blob, splice, restream.
The reference here is always built from the numpy steps, so the native pass is checked against an
implementation that shares none of its code.
"""

from __future__ import annotations

import dataclasses

import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.buffers import grow_unwritten
from pc_cpu.kvstate.rope import RopeMode

from .conftest import GGML_F16, GGML_F32, BlobSpec, assemble, make_blob

needs_native = pytest.mark.skipif(not native.available(), reason="libpc_native not built")


def _steps(blobs, deltas, rope, n_stream: int) -> bytes:
    """The three steps assemble replaces, with the numpy implementation."""
    moved = [state_blob.relocate(b, d, rope) if d else b for b, d in zip(blobs, deltas)]
    return bytes(state_blob.restream(state_blob.splice(moved), n_stream))


def _documents(spec: BlobSpec, n: int) -> list[bytes]:
    """n blobs at the same home positions, as documents encoded after one preamble (different K/V)."""
    return [make_blob(dataclasses.replace(spec, seed=i)) for i in range(n)]


@needs_native
@pytest.mark.parametrize("k_type", [GGML_F16, GGML_F32], ids=["f16", "f32"])
@pytest.mark.parametrize("v_trans", [False, True], ids=["v_rows", "v_trans"])
@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX])
@pytest.mark.parametrize("n_stream", [1, 4])
def test_native_assemble_equals_relocate_splice_restream(k_type, v_trans, mode, n_stream):
    spec = BlobSpec(positions=tuple(range(10, 30)), k_type=k_type, v_trans=v_trans, head_dim=16)
    rope = dataclasses.replace(spec.rope(mode), freq_base=1_000_000.0)
    preamble = make_blob(dataclasses.replace(spec, positions=tuple(range(10)), seed=99))
    blobs = [preamble] + _documents(spec, 4)
    deltas = [0, 0, 20, 40, 60]  # the first document stays at its home, as in `ask`
    assert bytes(assemble(native, blobs, deltas, rope, n_stream)) == _steps(blobs, deltas, rope, n_stream)


@needs_native
@pytest.mark.parametrize("threads", ["1", "2", "3", "8"])
def test_native_assemble_turns_the_same_bytes_on_any_number_of_threads(threads, monkeypatch):
    # The K rows are turned in shares of cells that split blobs and layers at odd places (7, 13 and
    # 23 cells, two caches): every thread count must give the numpy steps' bytes.
    monkeypatch.setenv("PC_NATIVE_THREADS", threads)
    spec = BlobSpec(positions=tuple(range(4, 11)), n_section=2, head_dim=16)
    ropes = (dataclasses.replace(spec.rope(), freq_base=1_000_000.0), spec.rope(RopeMode.NEOX))
    blobs = [make_blob(dataclasses.replace(spec, positions=tuple(range(4, 4 + n)), seed=n)) for n in (7, 13, 23)]
    deltas = [3, 40, 90]
    assert bytes(assemble(native, blobs, deltas, ropes, 1)) == _steps(blobs, deltas, ropes, 1)


@needs_native
def test_native_assemble_moves_each_cache_with_its_own_rope():
    spec = BlobSpec(positions=tuple(range(5, 25)), n_section=2)
    ropes = (dataclasses.replace(spec.rope(), freq_base=1_000_000.0), spec.rope(RopeMode.NEOX))
    blobs = _documents(spec, 3)
    deltas = [-5, 15, 35]
    assert bytes(assemble(native, blobs, deltas, ropes, 3)) == _steps(blobs, deltas, ropes, 3)


@needs_native
def test_native_assemble_equals_the_steps_on_real_blobs(real_blobs, smollm2):
    # Module A sits at [0, n_a), B right after it; moving B forward and A after it reorders them.
    a, b = real_blobs.a, real_blobs.b
    for blobs, deltas in (([a, b], [0, 7]), ([b, a], [-real_blobs.n_a, real_blobs.n_b + 3])):
        expected = _steps(blobs, deltas, smollm2.rope, 8)
        assert bytes(assemble(native, blobs, deltas, smollm2.rope, 8)) == expected


def test_assemble_without_moves_needs_no_rope(impl):
    # Blobs that stay where they are may carry what the relocator refuses (quantized K, M-RoPE).
    blobs = [make_blob(BlobSpec(positions=(0, 1), k_type=8)), make_blob(BlobSpec(positions=(2, 3), k_type=8))]
    out = assemble(impl, blobs, [0, 0], None, 2)
    assert bytes(out) == bytes(state_blob.restream(state_blob.splice(blobs), 2))
    assert state_blob.scan(out).n_cell == 4


@pytest.mark.parametrize("blobs, deltas, rope, n_stream, code", [
    ([BlobSpec(), BlobSpec()], [0, 0], "rope", 1, "overlap"),                # same home, neither moved
    ([BlobSpec(), BlobSpec()], [0, 2], "rope", 1, "overlap"),                # moved onto the other
    ([BlobSpec(), BlobSpec()], [0, 3], None, 1, "argument"),                 # a move without a rope
    ([BlobSpec(), BlobSpec(k_type=8)], [0, 3], "rope", 1, "unsupported"),    # moving quantized K
    ([BlobSpec(), BlobSpec(ext=True)], [0, 3], "rope", 1, "unsupported"),    # moving M-RoPE cells
    ([BlobSpec(), BlobSpec()], [0, -1], "rope", 1, "argument"),              # to position -1
    ([BlobSpec(), BlobSpec()], [0, 2**31], "rope", 1, "argument"),           # not an int32
    ([BlobSpec(), BlobSpec()], [0], "rope", 1, "argument"),                  # a delta missing
    ([BlobSpec()], [0], "rope", 0, "argument"),                              # no stream
    ([BlobSpec()], [0], "rope", 257, "argument"),                            # more than LLAMA_MAX_SEQ
    ([BlobSpec(), BlobSpec(n_layer=3)], [0, 3], "rope", 1, "mismatch"),      # another model
], ids=["overlap", "moved_onto", "no_rope", "quantized_k", "ext", "negative", "delta_overflow", "lengths",
        "zero_streams", "too_many_streams", "mismatch"])
def test_assemble_refuses(impl, blobs, deltas, rope, n_stream, code):
    made = [make_blob(s) for s in blobs]
    with pytest.raises(StateBlobError) as e:
        assemble(impl, made, deltas, blobs[0].rope() if rope else None, n_stream)
    assert e.value.code == code


def test_assemble_names_a_truncated_blob_before_a_bad_move(impl):
    good, cut = make_blob(BlobSpec()), make_blob(BlobSpec(positions=(5, 6)))[:-3]
    with pytest.raises(StateBlobError) as e:
        assemble(impl, [good, cut], [0, -10], BlobSpec().rope(), 1)
    assert e.value.code == "truncated"


def test_assemble_into_grows_the_buffer_and_reuses_it(impl):
    spec = BlobSpec(positions=tuple(range(8)))
    blobs, rope = _documents(spec, 3), spec.rope()
    expected = bytes(assemble(impl, blobs, [0, 8, 16], rope, 2))
    out = bytearray(10)
    n = impl.assemble_into(blobs, [0, 8, 16], rope, 2, out)
    assert n == len(expected) and bytes(out[:n]) == expected
    smaller = bytes(assemble(impl, blobs[:2], [0, 8], rope, 2))
    n2 = impl.assemble_into(blobs[:2], [0, 8], rope, 2, out)  # into the grown buffer: not resized
    assert len(out) == len(expected) and bytes(out[:n2]) == smaller


@needs_native
@pytest.mark.parametrize("v_trans", [False, True], ids=["v_rows", "v_trans"])
@pytest.mark.parametrize("n_stream", [1, 4])
def test_native_assemble_writes_every_byte_of_a_grown_buffer(v_trans, n_stream):
    # The buffer grows without its new bytes written (grow_unwritten): what it held must not show.
    spec = BlobSpec(positions=tuple(range(8)), v_trans=v_trans)
    blobs, rope = _documents(spec, 3), spec.rope()
    expected = bytes(assemble(native, blobs, [0, 8, 16], rope, n_stream))
    out = bytearray(b"\xab" * (len(expected) + 64))
    del out[4:]  # shrunk to 4 bytes: the next growth may hand back the 0xab bytes as they are
    n = native.assemble_into(blobs, [0, 8, 16], rope, n_stream, out)
    assert bytes(out[:n]) == expected


def test_grow_unwritten_refuses_while_a_view_is_alive():
    out = bytearray(4)
    view = memoryview(out)
    with pytest.raises(BufferError):
        grow_unwritten(out, 1 << 20)
    view.release()
    grow_unwritten(out, 1 << 20)
    assert len(out) == 1 << 20
