"""Computes a schema's encodings (modules, and scaffolds jointly) into library sequences of the context."""

from __future__ import annotations

from typing import Callable

from pc_cpu.engine.context import Context
from pc_cpu.pml.encoding import SCAFFOLD_PREFIX, ScaffoldJob, encode_jobs, scaffold_job
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
    copying them, so the library gets the move too, and `apply_pending_shifts`
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
        apply_pending_shifts(ctx, scratch)


def apply_pending_shifts(ctx: Context, scratch: int) -> None:
    """Makes llama.cpp re-rotate K of every moved cell now, by decoding one throwaway token.

    llama.cpp applies seq_add's K-shift at the start of the next llama_decode and
    has no other public call for it; the token goes into the empty scratch sequence
    and is dropped at once.
    """
    try:
        ctx.decode([ctx.model.bos_id if ctx.model.bos_id is not None else 0], [0], scratch, logits_last=False)
    finally:
        ctx.seq_rm(scratch)


def encode_key(ctx: Context, layout: Layout, key: str, *, mode: str, scratch: int, library: int,
               library_of: Callable[[str], int | None]) -> None:
    """Computes the encoding `key` (a module, or scaffold_key(name)) into `library` at its layout positions."""
    if key.startswith(SCAFFOLD_PREFIX):
        job = scaffold_job(layout, key[len(SCAFFOLD_PREFIX):], mode)
        if job is not None:
            encode_scaffold(ctx, job, scratch=scratch, library=library, library_of=library_of)
    else:
        encode_module(ctx, layout, key, mode=mode, scratch=scratch, library=library, library_of=library_of)


def drop_module(ctx: Context, resident: ResidentTier, key) -> None:
    """Frees a resident module's cells and forgets it."""
    seq, intervals = resident.remove(key)
    for start, end in intervals:
        ctx.seq_rm(seq, start, end)
