"""Gives the one description of cells that are computed once and reused: a Segment.

What pc_cpu computes apart and reuses elsewhere is a segment: a schema module's run, a
scaffold's members computed together, a document's preamble, a document after its preamble (and
stand-ins). A segment says which tokens to compute, after which context, at which positions; it
does not say where its cells go afterwards or under which key they are kept. That is the business
of the layout that places it (pml.encoding for schemas, pml.document_layout for documents), and
the engine computes every segment in one place (pc_cpu.engine.cells.encoder: Workspace.compute,
Encoder.compute_apart).

A conversation's turn is not a segment, on purpose: its cells are never computed apart from what
precedes them. A turn is the conversation's own prefix, computed in the prompt's stream in the
full prefill's decode calls and stored as it stands (a tip, keyed by its tokens and calls:
pc_cpu.pml.content_keys.prefix_digests); a later turn restores it at the same positions and
computes only what follows. Nothing in it has a context to drop or runs to place, which is all a
Segment adds (pml.chat.ChatPrompt describes a turn; pc_cpu.engine.prompts.chat_prompt keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pc_cpu.pml.layout import Run


@dataclass(frozen=True)
class Segment:
    """Compute `context`, then the runs back to back from runs[0].start; keep only the runs, each at its start.

    llama.cpp accepts only consecutive positions after a sequence's last cell, so the runs are
    computed one after the other (computed_starts) in one sequence, each seeing the context and
    the runs before it, and a run computed elsewhere than its start is then moved there. A
    segment of one run (a module's run, a document) is computed where it stays.
    """

    name: str  # what the cells belong to: a module, a scaffold's key, a document's store label
    runs: tuple[Run, ...]  # in position order, none adjacent to the next (adjacent runs are one)
    context: tuple[int, ...] = ()  # computed right before runs[0].start; its cells are dropped
    shared_context: tuple[tuple[str, int, int], ...] = ()  # (encoding, start, end) resident cells that are the context
    after: str | None = None  # the chain neighbour whose resident cells the context must be shared from

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError(f"segment {self.name!r} has no runs")

    @property
    def start(self) -> int:
        return self.runs[0].start

    @property
    def end(self) -> int:
        return self.runs[-1].end

    @property
    def first_position(self) -> int:
        """Returns the position of the context's first token (the start when there is no context)."""
        return self.start - len(self.context)

    @property
    def tokens(self) -> tuple[int, ...]:
        """Returns the runs' tokens back to back: what one decode computes after the context."""
        return tuple(t for run in self.runs for t in run.tokens)

    @property
    def n_tokens(self) -> int:
        return sum(len(run.tokens) for run in self.runs)

    def computed_starts(self) -> tuple[int, ...]:
        """Returns where each run is computed: right after the previous one, from runs[0].start."""
        starts, pos = [], self.start
        for run in self.runs:
            starts.append(pos)
            pos += len(run.tokens)
        return tuple(starts)

    def moved(self, shift: int) -> "Segment":
        """Returns the segment `shift` positions earlier, sharing no context (resident cells sit where they are)."""
        if shift == 0:
            return self
        return replace(self, runs=tuple(Run(r.start - shift, r.tokens) for r in self.runs), shared_context=())
