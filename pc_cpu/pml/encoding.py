"""Gives the encode jobs of a schema: what to compute, and after which context, for each module.

A module's cells are computed once and reused, so what they attended to at encode
time is fixed. Two modes:

- "preamble" (default): each run of a module is computed after the schema text
  that encloses it: ROOT's text before it (BOS, system message, role markup) and
  its ancestors' and its own earlier tokens. A module right after the preamble
  then gets exactly the cells a full prefill gives.
- "independent": attention confined to the module's own tokens, as in the paper.

When the context lies exactly at the positions before the run and is itself
encoded (a module right after the system message), its cells are shared from
where they are resident and only the run is computed. Otherwise the context is
decoded at the positions just before the run, so positions stay consecutive in
one llama_decode, and its cells are dropped afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.layout import ROOT, Layout, Run

ENCODING_MODES = ("preamble", "independent")


@dataclass(frozen=True)
class EncodeJob:
    """Compute `context` then `run` at positions [run.start - len(context), run.end); keep only the run."""

    module: str
    run: Run
    context: tuple[int, ...]
    shared_context: tuple[tuple[str, int, int], ...] = ()  # (module, start, end) to share instead of computing

    @property
    def first_position(self) -> int:
        return self.run.start - len(self.context)


def check_mode(mode: str) -> str:
    """Returns `mode` if it is an encoding mode; raises naming the valid ones."""
    if mode not in ENCODING_MODES:
        raise PromptCacheError(f"encoding mode {mode!r} is unknown; use one of: {', '.join(ENCODING_MODES)}")
    return mode


def encode_jobs(layout: Layout, module: str, mode: str) -> list[EncodeJob]:
    """Returns the jobs that encode `module`'s own tokens, one per run, in position order."""
    check_mode(mode)
    owners = [module] if mode == "independent" else layout.ancestors(module) + [module]
    if module == ROOT:
        owners = [ROOT]
    jobs = []
    for run in layout.cached_runs(module):
        before = sorted((p for owner in owners for p in layout.modules[owner].pieces if p.end <= run.start),
                        key=lambda p: p.start)
        context = tuple(t for p in before for t in p.tokens)
        jobs.append(EncodeJob(module, run, context, _shareable(layout, owners, before, run)))
    return jobs


def _shareable(layout: Layout, owners: list[str], before: list, run: Run) -> tuple[tuple[str, int, int], ...]:
    """Returns the encoded ranges that tile [run.start - len(context), run.start), or () if they do not."""
    ranges: list[tuple[str, int, int]] = []
    expected = run.start - sum(len(p.tokens) for p in before)
    for piece in before:
        owner = next(o for o in owners if piece in layout.modules[o].pieces)
        inside_cached_run = any(r.start <= piece.start and piece.end <= r.end for r in layout.cached_runs(owner))
        if piece.start != expected or not inside_cached_run or owner == ROOT and piece.start >= layout.preamble_end:
            return ()
        if ranges and ranges[-1][0] == owner and ranges[-1][2] == piece.start:
            ranges[-1] = (owner, ranges[-1][1], piece.end)
        else:
            ranges.append((owner, piece.start, piece.end))
        expected = piece.end
    return tuple(ranges)
