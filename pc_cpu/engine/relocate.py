"""Moves saved cells to other positions: positions rewritten and K re-rotated for RoPE.

Two ways, measured against each other by `pc-cpu bench documents relocation` (bench/RESULTS.md):
- the C relocator (pc_cpu.kvstate.native, numpy twin in state_blob) rewrites a state
  blob's bytes: ~4x faster than llama.cpp's way, and the hot path (a document prompt
  moves and splices its blobs in one pass of it: DocumentEncoder._assembled);
- llama.cpp's own seq_add on a private copy, whose K-shift runs at the next decode:
  the fallback for RoPEs the relocator does not know, and for sliding-window
  architectures whose second RoPE base was not checked (pc_cpu.engine.model.cache_ropes).
"""

from __future__ import annotations

from pc_cpu.engine.context import Context
from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.state_blob import BlobLike, RopeParams

# The C library when it is built, else its numpy twin (same bytes): scan, splice, relocate.
BLOBS = native if native.available() else state_blob


def scan_blob(blob: BlobLike):
    """Returns the StateBlobInfo of a blob, refusing malformed bytes before llama.cpp sees them."""
    return BLOBS.scan(blob)


def relocate_blob(blob: BlobLike, delta: int, rope: RopeParams | tuple[RopeParams, ...]) -> BlobLike:
    """Returns `blob` with every cell moved by `delta` positions (the same bytes when delta is 0).

    `rope`: the model's RoPE, or one per KV cache of the blob (pc_cpu.engine.model.cache_ropes).
    """
    return blob if delta == 0 else BLOBS.relocate(blob, delta, rope)


def splice_blobs(blobs: list[BlobLike]) -> BlobLike:
    """Returns one blob holding the cells of `blobs` (disjoint positions), in their order."""
    return blobs[0] if len(blobs) == 1 else BLOBS.splice(blobs)


def copy_moved(ctx: Context, source: int, start: int, end: int, delta: int, dest: int, *, scratch: int,
               rope: RopeParams | tuple[RopeParams, ...] | None) -> bool:
    """Puts a private copy of `source`'s cells at [start, end), moved by `delta`, into sequence `dest`.

    `source`'s cells stay where they are (other prompts may share them). Returns True when the
    copy's K rotation is still pending in llama.cpp (the seq_add fallback, used when `rope` is
    None): apply_pending_shifts, or any decode, applies it. `rope`: as for relocate_blob.
    """
    ctx.seq_rm(scratch)
    try:
        ctx.seq_cp(source, scratch, start, end)
        blob = ctx.state_get(scratch)
        if rope is not None:
            ctx.state_set(scratch, relocate_blob(blob, delta, rope))
        else:
            ctx.state_set(scratch, blob)  # new cells: moving them leaves `source`'s alone
            ctx.seq_add(scratch, start, end, delta)
        ctx.seq_cp(scratch, dest, start + delta, end + delta)
    finally:
        ctx.seq_rm(scratch)
    return rope is None
