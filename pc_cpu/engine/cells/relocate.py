"""Moves saved cells to other positions: positions rewritten and K re-rotated for RoPE.

Two ways, measured against each other by `pc-cpu bench documents relocation` (bench/RESULTS.md):
- the C relocator (pc_cpu.kvstate.ops.relocate; numpy twin without libpc_native) rewrites a state
  blob's bytes: ~4x faster than llama.cpp's way, and the hot path (a document prompt
  moves and splices its blobs in one pass of it: DocumentEncoder.assembled);
- llama.cpp's own seq_add on a private copy, whose K-shift runs at the next decode:
  the fallback for RoPEs the relocator does not know, and for sliding-window
  architectures whose second RoPE base was not checked (pc_cpu.engine.llama.model.cache_ropes).

Every move of cells goes through this module: `move` (one saved blob) and `move_together`
(several, joined into one restore blob: the hot path of a question over documents) choose
between the two ways; `cut` takes a blob's cells at some positions; `shift_live` moves cells
still being computed in a sequence (a scaffold's runs, a parameter after a gap), with seq_add,
whose K-shift the next llama_decode applies.
"""

from __future__ import annotations

from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.kvstate import ops
from pc_cpu.kvstate.rope import RopeParams

Rope = RopeParams | tuple[RopeParams, ...] | None  # one per KV cache of a saved state; None: llama.cpp moves cells


def move(ctx: Context, blob, delta: int, rope: Rope, *, seq: int, empty: int, out: bytearray | None = None):
    """Returns a one-stream blob of `blob`'s cells moved by `delta` positions, K re-rotated (`blob` when delta is 0).

    The one way cells move in pc_cpu, whatever they are (a module, a document, a turn): the
    relocator rewrites the bytes where it knows the model's RoPE (`rope`); else llama.cpp moves
    them, in the free stream `seq` of `ctx`, and a throwaway token decoded in the free stream
    `empty` makes it rotate K now (a saved state carries no pending shift: its K would be read
    out unrotated at the new positions). Both ways give the same bytes, the blob's own sequence
    id kept (tests/engine/test_documents.py holds them to it). `out`: a buffer the relocator
    reuses, copying and turning the cells in one pass; the view of it returned is released
    before the next use (mapping a fresh ~100 MB copy costs more than moving it).
    """
    if delta == 0:
        return blob
    if rope is not None:
        if out is None:
            return ops.relocate(blob, delta, rope)
        return move_together(ctx, [blob], [delta], rope, 1, out, seq=seq, empty=empty)
    info = ops.scan(blob)
    try:
        ctx.state_set(seq, ops.restream(blob, ctx.n_stream))
        ctx.seq_add(seq, info.pos_min, info.pos_max + 1, delta)
        apply_pending_shifts(ctx, empty)
        return ops.with_sequence(ops.restream(ctx.state_get(seq), 1), info.seq_id)
    finally:
        ctx.seq_rm(seq)


def move_together(ctx: Context, blobs, deltas, rope: Rope, n_stream: int, out: bytearray, *, seq: int, empty: int):
    """Returns one restore blob for `n_stream` streams of every blob's cells moved by its delta, joined in position order.

    With the relocator: one pass of the C library (pc_state_assemble) into `out`, a buffer
    reused across prompts (mapping ~10-100 MB of new pages cost more than the copy); the view
    returned is released before the next use; blobs that do not move need no relocator. Else each
    blob is moved by llama.cpp (`move`).
    """
    if rope is None and any(deltas):  # nothing moving needs no rope: the one pass below joins them
        if seq == empty:
            raise ValueError(f"move_together: llama.cpp moves cells in stream {seq} and needs another free one")
        return ops.restore_blob([move(ctx, blob, delta, rope, seq=seq, empty=empty)
                                 for blob, delta in zip(blobs, deltas)], n_stream)
    size = ops.assemble_into(blobs, deltas, rope, n_stream, out)  # before the view: it may grow `out`
    return memoryview(out)[:size]


def cut(ctx: Context, blob, lo: int, hi: int, *, seq: int) -> bytearray:
    """Returns a one-stream blob of `blob`'s cells at positions [lo, hi), cut by llama.cpp in the free stream `seq`."""
    try:
        ctx.state_set(seq, ops.restream(blob, ctx.n_stream))
        ctx.seq_rm(seq, 0, lo)
        ctx.seq_rm(seq, hi, -1)
        return ops.restream(ctx.state_get(seq), 1)
    finally:
        ctx.seq_rm(seq)


def shift_live(ctx: Context, seq: int, start: int, end: int, delta: int) -> None:
    """Moves the cells sequence `seq` holds at [start, end) by `delta` positions, in place (llama.cpp's seq_add).

    For cells still being computed there; K is re-rotated at the next llama_decode
    (apply_pending_shifts, where nothing else will decode first).
    """
    ctx.seq_add(seq, start, end, delta)


def copy_moved(ctx: Context, roles: SequenceRoles, source: int, start: int, end: int, delta: int, dest: int,
               rope: Rope) -> None:
    """Puts a private copy of `source`'s cells at [start, end), moved by `delta`, into sequence `dest`.

    `source`'s cells stay where they are (other prompts may share them); the copy is read
    through the library's scratch sequence and moved (`move`) with the hold as its free stream.
    """
    scratch = roles.scratch
    ctx.seq_rm(scratch)
    try:
        ctx.seq_cp(source, scratch, start, end)
        blob = ctx.state_get(scratch)
        ctx.seq_rm(scratch)
        ctx.state_set(scratch, move(ctx, blob, delta, rope, seq=scratch, empty=roles.hold))
        ctx.seq_cp(scratch, dest, start + delta, end + delta)
    finally:
        ctx.seq_rm(scratch)


def apply_pending_shifts(ctx: Context, empty: int) -> None:
    """Makes llama.cpp re-rotate K of every moved cell now, by decoding one throwaway token.

    llama.cpp applies seq_add's K-shift at the start of the next llama_decode and
    has no other public call for it; the token goes into the empty sequence `empty`
    and is dropped at once.
    """
    try:
        ctx.decode([ctx.model.bos_id if ctx.model.bos_id is not None else 0], [0], empty, logits_last=False)
    finally:
        ctx.seq_rm(empty)
