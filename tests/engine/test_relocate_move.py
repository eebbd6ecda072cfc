"""engine.relocate.move: the one way saved cells move; with a reused buffer, the same bytes as a fresh copy."""

from __future__ import annotations

from pc_cpu.engine.cells.relocate import move
from pc_cpu.kvstate import ops
from pc_cpu.kvstate.rope import RopeMode
from tests.native.conftest import BlobSpec, make_blob


def test_moving_into_a_reused_buffer_gives_the_bytes_of_a_fresh_copy_and_grows_it():
    small, large = (BlobSpec(positions=tuple(range(start, start + n)), head_dim=16) for start, n in ((5, 3), (40, 30)))
    rope = small.rope(RopeMode.NEOX)
    out = bytearray()
    for spec, delta in ((small, 7), (large, -20), (small, 300)):  # the buffer grows, then serves a smaller blob
        blob = make_blob(spec)
        moved = move(None, blob, delta, rope, seq=0, empty=1, out=out)  # the relocator needs no context
        try:
            assert bytes(moved) == bytes(ops.relocate(blob, delta, rope))
            assert ops.scan(moved).pos_min == spec.positions[0] + delta
        finally:
            moved.release()
    assert move(None, blob, 0, rope, seq=0, empty=1, out=out) is blob  # nothing to move: the blob itself
