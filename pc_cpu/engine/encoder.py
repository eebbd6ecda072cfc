"""Encodes a schema's modules, and its scaffolds jointly, into resident library sequences (tier 0)."""

from __future__ import annotations

from typing import Callable

from pc_cpu.engine.context import Context
from pc_cpu.pml.encoding import ScaffoldJob, encode_jobs, scaffold_jobs
from pc_cpu.pml.layout import Layout
from pc_cpu.store.resident import ResidentTier


def encode_module(ctx: Context, layout: Layout, module: str, *, mode: str, scratch: int, library: int,
                  library_of: Callable[[str], int | None]) -> None:
    """Computes `module`'s cells at its layout positions and shares them into `library`.

    Each run is decoded in the empty `scratch` sequence after its context: shared
    from resident modules when it lies right before the run, else computed there
    too (an empty sequence accepts any first position). Only the run's cells are
    then shared into the library sequence, and emptying the scratch frees the rest.
    """
    for job in encode_jobs(layout, module, mode):
        ctx.seq_rm(scratch)
        try:
            _decode_after_context(ctx, scratch, job.shared_context, job.context, job.run.tokens, job.run.start,
                                  library_of)
            ctx.seq_cp(scratch, library, job.run.start, job.run.end)
        finally:
            ctx.seq_rm(scratch)


def _decode_after_context(ctx: Context, scratch: int, shared_context, context: tuple[int, ...],
                          tokens: tuple[int, ...], start: int, library_of: Callable[[str], int | None]) -> None:
    """Computes `tokens` at [start, ...) in the empty `scratch` sequence, after their context.

    The context's cells are shared from resident encodings when `shared_context` names
    them all; otherwise the context tokens are computed right before `start`.
    """
    sources = [(library_of(m), a, b) for m, a, b in shared_context]
    if sources and all(seq is not None for seq, _, _ in sources):
        for seq, a, b in sources:
            ctx.seq_cp(seq, scratch, a, b)
        ctx.decode(tokens, range(start, start + len(tokens)), scratch, logits_last=False)
    else:
        first = start - len(context)
        ctx.decode(context + tokens, range(first, start + len(tokens)), scratch, logits_last=False)


def encode_scaffold(ctx: Context, job: ScaffoldJob, *, scratch: int, library: int,
                    library_of: Callable[[str], int | None]) -> None:
    """Computes a scaffold's member runs jointly and shares them, at their layout positions, into `library`.

    The runs are decoded back to back in the empty `scratch` sequence after the
    first member's context (llama.cpp needs consecutive positions), then each
    later run is moved forward to its layout position with seq_add. Only scratch
    holds those cells at that point, so moving them moves nobody else's. The move
    re-rotates K lazily, at the next llama_decode; seq_cp shares cells rather than
    copying them, so the library gets the move too, and `_apply_pending_shifts`
    forces it before this returns (state blobs read later must hold rotated K).
    """
    ctx.seq_rm(scratch)
    moved = False
    try:
        _decode_after_context(ctx, scratch, job.shared_context, job.context, job.tokens, job.runs[0].start,
                              library_of)
        # Last run first: each moves forward onto positions no run still to move occupies.
        for run, computed in reversed(list(zip(job.runs, job.computed_starts()))):
            if run.start != computed:
                ctx.seq_add(scratch, computed, computed + len(run.tokens), run.start - computed)
                moved = True
        for run in job.runs:
            ctx.seq_cp(scratch, library, run.start, run.end)
    finally:
        ctx.seq_rm(scratch)
    if moved:
        _apply_pending_shifts(ctx, scratch)


def _apply_pending_shifts(ctx: Context, scratch: int) -> None:
    """Makes llama.cpp re-rotate K of every moved cell now, by decoding one throwaway token.

    llama.cpp applies seq_add's K-shift at the start of the next llama_decode and
    has no other public call for it; the token goes into the empty scratch sequence
    and is dropped at once.
    """
    try:
        ctx.decode([ctx.model.bos_id if ctx.model.bos_id is not None else 0], [0], scratch, logits_last=False)
    finally:
        ctx.seq_rm(scratch)


def encode_schema(ctx: Context, layout: Layout, resident: ResidentTier, *, mode: str, scratch: int) -> int:
    """Encodes every module, then every scaffold, of `layout` not yet resident; returns the cells added.

    A scaffold's joint encoding is kept under the key (schema, scaffold_key(name)).
    """
    library_of = lambda key: resident.get((layout.schema, key))  # noqa: E731
    added = 0
    for name in layout.modules:
        runs = layout.cached_runs(name)
        if not runs:
            continue
        added += _encode_into_library(ctx, resident, (layout.schema, name), runs, lambda library: encode_module(
            ctx, layout, name, mode=mode, scratch=scratch, library=library, library_of=library_of))
    for job in scaffold_jobs(layout, mode):
        added += _encode_into_library(ctx, resident, (layout.schema, job.key), job.runs,
                                      lambda library: encode_scaffold(ctx, job, scratch=scratch, library=library,
                                                                      library_of=library_of))
    return added


def _encode_into_library(ctx: Context, resident: ResidentTier, key, runs, encode: Callable[[int], None]) -> int:
    """Places `key` in a library sequence and encodes it there, unless already resident; returns cells added."""
    if resident.contains(key):
        return 0
    library = resident.put(key, tuple((run.start, run.end) for run in runs))
    try:
        encode(library)
    except Exception:
        drop_module(ctx, resident, key)
        raise
    return sum(len(run.tokens) for run in runs)


def drop_module(ctx: Context, resident: ResidentTier, key) -> None:
    """Frees a resident module's cells and forgets it."""
    seq, intervals = resident.remove(key)
    for start, end in intervals:
        ctx.seq_rm(seq, start, end)
