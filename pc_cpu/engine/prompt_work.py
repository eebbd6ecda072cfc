"""What the scheduler asks of a prompt (PromptWork), and the typed values it gets back (Counts, Head, IdleTask).

Two kinds of prompt answer it, as sibling modules: pc_cpu.engine.schema_prompt.SchemaPrompt
(a PML prompt assembled from a schema's modules) and pc_cpu.engine.document_prompt.DocumentWork
(a question over documents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Protocol

from pc_cpu.result import Tier


@dataclass(frozen=True)
class Counts:
    """A prompt's tokens by where their cells came from, and what it used: the Result's counts."""

    cached: int  # tokens whose cells were saved before (modules, documents)
    uncached: int  # tokens computed for this prompt (its own text, arguments, recomputed tokens)
    modules: tuple[str, ...]  # the modules or documents it used, in position order


@dataclass(frozen=True)
class Head:
    """What a prompt's restored cells are, and where they end: the key under which a stream's cells are reused.

    Two prompts with equal heads restore the same bytes at the same positions, so a stream
    still holding the first's can serve the second by computing only its tail.
    """

    cells: tuple  # hashable: what the cells are (content keys and positions, or tokens and positions)
    end: int  # the position after the last of them: the cells a stream keeps


@dataclass(frozen=True)
class IdleTask:
    """Cells a finished prompt asks for while nothing waits or runs: tokens computed in a free slot's stream, then kept.

    The scheduler computes `tokens` at positions 0..n-1 of an empty stream, one n_batch chunk
    per step of its worker (the chunks Context.decode makes), and gives up the stream (to
    start again later) when a prompt arrives before a chunk. Once every token is computed,
    `save(slot)` stores the stream's cells and returns their Head: the slot keeps them for
    the next prompt with that head (None: nothing was stored, and the stream is emptied).
    """

    key: Hashable  # what the cells are: one task per key waits at a time
    tokens: tuple[int, ...]
    save: Callable[[int], Head | None]
    skip: Callable[[], bool] = lambda: False  # asked before it starts: True drops it (the cells are stored already)


class PromptWork(Protocol):
    """A prompt as the scheduler sees it: its size, how to build its stream, what its Result reports."""

    use_cache: bool

    def positions(self) -> int:
        """Returns the positions the prompt occupies in its stream before generating."""

    def prepare(self) -> dict[str, Tier]:
        """Makes the prompt's saved cells available; returns the tier that served each (Result.tiers)."""

    def prefill(self, slot: int) -> int:
        """Builds the prompt in the empty stream `slot`; returns where generation continues (logits ready)."""

    def counts(self) -> Counts:
        """Returns the prompt's cached and computed tokens and what it used, for the Result."""

    def head(self) -> Head | None:
        """Returns what the prompt's restored cells are and where they end, or None.

        A stream holding an equal head serves the prompt by computing only its tail
        (`prefill_tail`): exactly the cells a fresh restore gives. None: nothing to reuse
        (the baseline, or cells computed in the library, whose bits depend on its history).
        """

    def prefill_tail(self, slot: int) -> int:
        """Computes the prompt's tail in stream `slot`, which holds its head already; returns where generation continues."""

    def held_tiers(self) -> dict[str, Tier]:
        """Returns Result.tiers when the head was found in the prompt's stream: every encoding from the context."""

    def idle_task(self) -> IdleTask | None:
        """Returns the cells worth computing for prompts like this one once the scheduler is idle, or None.

        Asked when the prompt has finished.
        """
