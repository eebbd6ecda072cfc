"""Encodes a schema's modules into resident library sequences (tier 0)."""

from __future__ import annotations

from typing import Callable

from pc_cpu.engine.context import Context
from pc_cpu.pml.encoding import encode_jobs
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
            sources = [(library_of(m), start, end) for m, start, end in job.shared_context]
            if sources and all(seq is not None for seq, _, _ in sources):
                for seq, start, end in sources:
                    ctx.seq_cp(seq, scratch, start, end)
                ctx.decode(job.run.tokens, range(job.run.start, job.run.end), scratch, logits_last=False)
            else:
                ctx.decode(job.context + job.run.tokens, range(job.first_position, job.run.end), scratch,
                           logits_last=False)
            ctx.seq_cp(scratch, library, job.run.start, job.run.end)
        finally:
            ctx.seq_rm(scratch)


def encode_schema(ctx: Context, layout: Layout, resident: ResidentTier, *, mode: str, scratch: int) -> int:
    """Encodes every module of `layout` not yet resident; returns the number of cells added."""
    added = 0
    for name in layout.modules:
        key = (layout.schema, name)
        runs = layout.cached_runs(name)
        if resident.contains(key) or not runs:
            continue
        intervals = tuple((run.start, run.end) for run in runs)
        library = resident.put(key, intervals)
        try:
            encode_module(ctx, layout, name, mode=mode, scratch=scratch, library=library,
                          library_of=lambda module: resident.get((layout.schema, module)))
        except Exception:
            drop_module(ctx, resident, key)
            raise
        added += sum(len(run.tokens) for run in runs)
    return added


def drop_module(ctx: Context, resident: ResidentTier, key) -> None:
    """Frees a resident module's cells and forgets it."""
    seq, intervals = resident.remove(key)
    for start, end in intervals:
        ctx.seq_rm(seq, start, end)
