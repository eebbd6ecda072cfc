"""Moves saved cells to other positions: positions rewritten and K re-rotated for RoPE.

Two ways, measured against each other by `pc-cpu bench documents relocation` (bench/RESULTS.md):
- the C relocator (pc_cpu.kvstate.ops.relocate; numpy twin without libpc_native) rewrites a state
  blob's bytes: ~4x faster than llama.cpp's way, and the hot path (a document prompt
  moves and splices its blobs in one pass of it: DocumentEncoder._assembled);
- llama.cpp's own seq_add on a private copy, whose K-shift runs at the next decode:
  the fallback for RoPEs the relocator does not know, and for sliding-window
  architectures whose second RoPE base was not checked (pc_cpu.engine.model.cache_ropes).
"""

from __future__ import annotations

from pc_cpu.engine.context import Context
from pc_cpu.engine.sequences import SequenceRoles
from pc_cpu.kvstate import ops
from pc_cpu.kvstate.rope import RopeParams


def copy_moved(ctx: Context, roles: SequenceRoles, source: int, start: int, end: int, delta: int, dest: int,
               rope: RopeParams | tuple[RopeParams, ...] | None) -> bool:
    """Puts a private copy of `source`'s cells at [start, end), moved by `delta`, into sequence `dest`.

    `source`'s cells stay where they are (other prompts may share them); the copy is made in
    the library's scratch sequence. Returns True when the copy's K rotation is still pending in
    llama.cpp (the seq_add fallback, used when `rope` is None): apply_pending_shifts, or any
    decode, applies it. `rope`: as for pc_cpu.kvstate.ops.relocate.
    """
    scratch = roles.scratch
    ctx.seq_rm(scratch)
    try:
        ctx.seq_cp(source, scratch, start, end)
        blob = ctx.state_get(scratch)
        if rope is not None:
            ctx.state_set(scratch, ops.relocate(blob, delta, rope))
        else:
            ctx.state_set(scratch, blob)  # new cells: moving them leaves `source`'s alone
            ctx.seq_add(scratch, start, end, delta)
        ctx.seq_cp(scratch, dest, start + delta, end + delta)
    finally:
        ctx.seq_rm(scratch)
    return rope is None
