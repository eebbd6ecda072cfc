"""pc_cpu.kvstate.ops: one implementation chosen once, and the shortcuts its callers rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

import pc_cpu
from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, ops, state_blob
from tests.native.conftest import BlobSpec, make_blob

IMPLS = [pytest.param(state_blob, id="numpy"),
         pytest.param(native, id="native",
                      marks=pytest.mark.skipif(not native.available(), reason="libpc_native not built"))]


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Runs ops on one implementation, as a test forces the numpy path."""
    monkeypatch.setattr(ops, "IMPL", request.param)
    return request.param


def test_the_c_library_is_chosen_when_it_is_usable():
    assert ops.IMPL is (native if native.available() else state_blob)


def test_setting_impl_routes_every_call_through_it(impl):
    # The two twins raise the same code with different sentences: the C one names its pc_status.
    with pytest.raises(StateBlobError) as e:
        ops.scan(b"\x00" * 16)
    assert e.value.code == "bad_magic" and ("pc_status" in str(e.value)) == (impl is native)


def test_no_move_returns_the_blob_as_it_is(impl):
    blob = make_blob(BlobSpec(positions=(4, 5)))
    assert ops.relocate(blob, 0, None) is blob  # no rope needed: nothing turns
    moved = ops.relocate(blob, 3, BlobSpec().rope())
    assert ops.scan(moved).pos_min == 7


@pytest.mark.parametrize("n_stream", [1, 3])
def test_restore_blob_is_the_splice_restreamed(impl, n_stream):
    blobs = [make_blob(BlobSpec(positions=p, seed=i, v_trans=True)) for i, p in enumerate([(6, 7), (0, 1, 2), (9,)])]
    out = ops.restore_blob(blobs, n_stream)
    assert isinstance(out, bytearray)
    assert bytes(out) == bytes(state_blob.restream(state_blob.splice(blobs), n_stream))
    assert bytes(ops.restore_blob(blobs[:1], n_stream)) == bytes(state_blob.restream(blobs[0], n_stream))
    with pytest.raises(StateBlobError) as e:
        ops.restore_blob([blobs[0], blobs[0]], n_stream)
    assert e.value.code == "overlap"


def test_only_kvstate_chooses_an_implementation():
    root = Path(pc_cpu.__file__).parent
    choosers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                      if "native.available()" in p.read_text() and p.parent.name != "kvstate")
    assert choosers == []
