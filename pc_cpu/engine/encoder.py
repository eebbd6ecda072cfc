"""Encodes a schema's modules into resident library sequences (tier 0)."""

from __future__ import annotations

from pc_cpu.engine.context import Context
from pc_cpu.pml.encoding import encode_jobs
from pc_cpu.pml.layout import Layout
from pc_cpu.store.resident import ResidentTier


def encode_module(ctx: Context, layout: Layout, module: str, *, mode: str, scratch: int, library: int) -> None:
    """Computes `module`'s cells at its layout positions and shares them into `library`.

    Each run is decoded with its context in the empty `scratch` sequence (an empty
    sequence accepts any first position), then only the run's cells are shared
    into the library sequence and the scratch is emptied, which frees the context cells.
    """
    for job in encode_jobs(layout, module, mode):
        tokens = job.context + job.run.tokens
        positions = range(job.first_position, job.run.end)
        ctx.seq_rm(scratch)
        try:
            ctx.decode(tokens, positions, scratch, logits_last=False)
            ctx.seq_cp(scratch, library, job.run.start, job.run.end)
        finally:
            ctx.seq_rm(scratch)


def encode_schema(ctx: Context, layout: Layout, resident: ResidentTier, *, mode: str, scratch: int) -> int:
    """Encodes every module of `layout` not yet resident; returns the number of cells added."""
    added = 0
    for name, module in layout.modules.items():
        key = (layout.schema, name)
        if resident.contains(key) or module.n_tokens == 0:
            continue
        intervals = tuple((run.start, run.end) for run in module.runs())
        library = resident.put(key, intervals)
        try:
            encode_module(ctx, layout, name, mode=mode, scratch=scratch, library=library)
        except Exception:
            drop_module(ctx, resident, key)
            raise
        added += module.n_tokens
    return added


def drop_module(ctx: Context, resident: ResidentTier, key) -> None:
    """Frees a resident module's cells and forgets it."""
    seq, intervals = resident.remove(key)
    for start, end in intervals:
        ctx.seq_rm(seq, start, end)
