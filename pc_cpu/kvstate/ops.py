"""The state-blob operations pc_cpu runs: on the C library (libpc_native) when it is built, else on numpy.

The choice is made once, when this module is imported: ``IMPL`` is :mod:`pc_cpu.kvstate.native`
when the library is present and of this ABI, else :mod:`pc_cpu.kvstate.state_blob`. The two give
the same bytes and raise :class:`~pc_cpu.errors.StateBlobError` with the same ``code``
(tests/native hold them to it), so nothing outside this module asks which one runs. A test runs
the numpy path by setting ``ops.IMPL`` to ``state_blob`` (monkeypatch).

The readers of a blob's contents (``section_*``, ``layer_kv``, ``with_sequence``) exist in numpy
only: nothing hot runs them. They are named here too, so that callers need this module alone.
"""

from __future__ import annotations

from typing import Sequence

from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.kvstate.state_blob import BlobLike, StateBlobInfo

IMPL = native if native.available() else state_blob

# numpy only (see the module docstring)
layer_kv = state_blob.layer_kv
section_cells = state_blob.section_cells
section_layers = state_blob.section_layers
section_positions = state_blob.section_positions
with_sequence = state_blob.with_sequence


def scan(blob: BlobLike) -> StateBlobInfo:
    """Returns what a blob holds, refusing malformed bytes (StateBlobError) before llama.cpp sees them."""
    return IMPL.scan(blob)


def relocate(blob: BlobLike, delta: int, rope: RopeParams | tuple[RopeParams, ...]) -> BlobLike:
    """Returns `blob` with every cell moved by `delta` positions, K re-rotated (`blob` itself when delta is 0).

    `rope`: the model's RoPE, or one per KV cache of the blob (pc_cpu.engine.llama.model.cache_ropes).
    """
    return blob if delta == 0 else IMPL.relocate(blob, delta, rope)


def assemble_into(blobs: Sequence[BlobLike], deltas: Sequence[int], rope: RopeParams | tuple[RopeParams, ...] | None,
                  n_stream: int, out: bytearray) -> int:
    """Writes the restore blob of `blobs`, blob i moved by deltas[i], for a context of `n_stream` streams, into `out`.

    One pass: each blob copied once, K turned on the way. `out` is grown when too small; reuse
    it across prompts. Returns the bytes written.
    """
    return IMPL.assemble_into(blobs, deltas, rope, n_stream, out)


def restore_blob(blobs: Sequence[BlobLike], n_stream: int) -> bytearray:
    """Returns one blob that restores the cells of `blobs` (disjoint positions, in their order) into a context of `n_stream` streams.

    The splice and the stream count rewritten in one pass, into a fresh buffer the caller owns.
    """
    out = bytearray()
    IMPL.assemble_into(blobs, [0] * len(blobs), None, n_stream, out)
    return out


def restream(blob: BlobLike, n_stream: int) -> bytearray:
    """Returns a copy of `blob` rewritten for a context of `n_stream` KV streams, its cells in the first."""
    return IMPL.restream(blob, n_stream)


def order_in_place(blob: bytearray | memoryview) -> None:
    """Sorts each KV cache's cells of the writable `blob` by position, where it lies (no new buffer to map)."""
    IMPL.order_in_place(blob)
