"""Malformed, truncated and mutated blobs: both implementations refuse them the same way.

Every call either raises StateBlobError with the same code in both implementations or returns
the same bytes; nothing crashes (a crash of the C library would take pytest down with it).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pc_cpu.kvstate import native, state_blob

from .conftest import BlobSpec, assemble, make_blob, outcome, sorted_in_place

pytestmark = pytest.mark.skipif(not native.available(), reason="libpc_native not built")

SPECS = [BlobSpec(), BlobSpec(v_trans=True, k_type=0, seq_id=2),
         BlobSpec(n_stream=3, stream=1, ext=True), BlobSpec(n_section=2, positions=(4,))]
BLOBS = [make_blob(s) for s in SPECS]
PARTNER = make_blob(BlobSpec(positions=(20, 21)))
ROPE = BlobSpec().rope()
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _same_everywhere(blob: bytes) -> None:
    """Every operation (assembly alone and with a valid partner) agrees between implementations."""
    calls = [("scan", (blob,)), ("assemble", ([blob], [0], None, 1)), ("assemble", ([PARTNER, blob], [0, 0], None, 1)),
             ("assemble", ([blob, PARTNER], [0, 0], None, 1)), ("relocate", (blob, 7, ROPE)),
             ("relocate", (blob, -3, ROPE)), ("assemble", ([PARTNER, blob], [0, 30], ROPE, 2)),
             ("assemble", ([blob, PARTNER], [-2, 0], ROPE, 1)), ("assemble", ([blob], [0], None, 3)),
             ("restream", (blob, 1)), ("restream", (blob, 3)), ("restream", (blob, 0)),
             ("order_in_place", (blob,))]
    for name, args in calls:
        if name in ("assemble", "order_in_place"):
            helper = assemble if name == "assemble" else sorted_in_place
            got, want = outcome(helper, native, *args), outcome(helper, state_blob, *args)
        else:
            got = outcome(getattr(native, name), *args)
            want = outcome(getattr(state_blob, name), *args)
        assert got == want, f"{name}: native {got[0]} {got[1] if got[0] == 'error' else ''}, numpy {want}"


@pytest.mark.parametrize("blob", BLOBS, ids=["f16", "vtrans_f32", "streams_ext", "iswa"])
def test_every_truncation_is_refused_alike(blob):
    for n in range(len(blob)):
        _same_everywhere(blob[:n])
        if n < len(blob) and not (n and SPECS[BLOBS.index(blob)].n_section > 1):
            assert outcome(native.scan, blob[:n])[0] == "error"


@FUZZ
@given(which=st.integers(0, len(BLOBS) - 1), flips=st.lists(st.integers(0, 10**9), min_size=1, max_size=4))
def test_bit_flips_are_refused_or_handled_alike(which, flips):
    blob = bytearray(BLOBS[which])
    for f in flips:
        blob[(f // 8) % len(blob)] ^= 1 << (f % 8)
    _same_everywhere(bytes(blob))


@FUZZ
@given(which=st.integers(0, len(BLOBS) - 1), at=st.integers(0, 10**9),
       value=st.sampled_from([0, 1, 2, 0xFF, 0x7F, 0x80, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 2**20]))
def test_header_fields_overwritten_with_edge_values(which, at, value):
    """Overwrite an aligned u32 in the first 300 bytes (where the headers live) with an edge value."""
    blob = bytearray(BLOBS[which])
    off = (at % (min(len(blob), 300) // 4)) * 4
    blob[off:off + 4] = value.to_bytes(4, "little")
    _same_everywhere(bytes(blob))


@FUZZ
@given(data=st.binary(max_size=200))
def test_garbage_is_refused_alike(data):
    _same_everywhere(data)
    _same_everywhere(BLOBS[0][:8] + data)  # a valid header, then garbage


def test_real_blob_mutations_are_refused_alike(real_blobs):
    rng = np.random.default_rng(0)
    blob = real_blobs.a
    info = state_blob.scan(blob)
    headers = 16 + 12 * info.n_cell + 8  # cells, then v_trans and n_layer
    points = list(range(0, headers + 40)) + list(rng.integers(0, len(blob), 200))
    for n in points:
        assert outcome(native.scan, blob[:n]) == outcome(state_blob.scan, blob[:n]) == ("error", "truncated")
    for _ in range(300):
        mutated = bytearray(blob)
        off = int(rng.integers(0, headers + 2000))
        mutated[off] ^= 1 << int(rng.integers(0, 8))
        for name in ("scan", "restream"):
            args = {"restream": (bytes(mutated), 4)}.get(name, (bytes(mutated),))
            assert outcome(getattr(native, name), *args) == outcome(getattr(state_blob, name), *args)
        joined = ([real_blobs.b, bytes(mutated)], [0, 0], None, 1)
        assert outcome(assemble, native, *joined) == outcome(assemble, state_blob, *joined)
        assert outcome(sorted_in_place, native, bytes(mutated)) == outcome(sorted_in_place, state_blob, bytes(mutated))


def test_wrong_argument_types_are_refused_alike():
    for bad in (None, 5, "text"):
        assert outcome(native.scan, bad) == outcome(state_blob.scan, bad) == ("error", "argument")
    assert outcome(native.relocate, BLOBS[0], 1, None) == outcome(state_blob.relocate, BLOBS[0], 1, None)
    for n_stream in (-1, 2**32, 2**40):
        assert outcome(native.restream, BLOBS[0], n_stream) == outcome(state_blob.restream, BLOBS[0], n_stream) \
            == ("error", "argument")
