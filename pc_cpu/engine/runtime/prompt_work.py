"""What the scheduler asks of a prompt (PromptWork), and the typed values it gets back (Counts, Head, IdleTask).

Three kinds of prompt answer it, in the prompts room: pc_cpu.engine.prompts.schema_prompt.SchemaPrompt
(a PML prompt assembled from a schema's modules), pc_cpu.engine.prompts.document_prompt.DocumentWork
(a question over documents) and pc_cpu.engine.prompts.chat_prompt.ChatWork (a conversation).
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


def same_head(work: "PromptWork", held: Head) -> int:
    """Returns held.end when `held` is the prompt's own head (its cells up to where its tail starts), else 0.

    PromptWork.reusable for prompts that reuse a whole head or nothing.
    """
    return held.end if held == work.head() else 0


@dataclass(frozen=True)
class Answer:
    """What a finished prompt generated, as its idle task and kept head need it."""

    tokens: tuple[int, ...]  # the sampled tokens (end-of-generation left out)
    decoded: int  # how many of them are in the stream (the last sampled one is not, unless it ended the answer)
    text: str  # the text the caller got
    finish_reason: str  # "stop", "length" or "cancelled"


@dataclass(frozen=True)
class IdleTask:
    """Cells a finished prompt asks for while nothing waits or runs: tokens computed in a free slot's stream, then kept.

    The scheduler computes `tokens` at positions start..start+n-1, one n_batch chunk per step of
    its worker, a chunk never crossing one of `calls` (so the chunks are those Context.decode
    makes of each call), and gives up the stream when a prompt arrives before a chunk. With no
    `base`, that is an emptied free stream, from position 0, and a task given up waits to start
    again. With a `base`, it is the free stream holding that head, cut at `start` (a task whose
    base is gone is dropped), and a task given up at position p leaves `stopped(p)` held there.
    Once every token is computed, `save(slot)` stores the stream's cells and returns their Head:
    the slot keeps them for the next prompt with that head (None: the stream is emptied).
    A task starts `delay` seconds after its prompt ended at the earliest. A task with no tokens
    and no base is work in the library context, not cells: it takes no stream, and
    `save(None)` runs in one step of the worker.
    """

    key: Hashable  # what the cells are: one task per key waits at a time
    tokens: tuple[int, ...]
    save: Callable[[int | None], Head | None]
    skip: Callable[[], bool] = lambda: False  # asked before it starts: True drops it (the cells are stored already)
    start: int = 0  # the position of tokens[0]
    base: Head | None = None  # the held head whose stream the task continues; None: an emptied stream
    calls: tuple[int, ...] = ()  # positions after `start` where a new decode call begins
    stopped: Callable[[int], Head | None] = lambda done: None  # with a base: what the stream holds if given up at `done`
    delay: float = 0.0  # seconds after the prompt ends before it may start (a request arriving meanwhile goes first)


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

    def reusable(self, held: Head) -> int:
        """Returns how many positions of a stream holding `held` this prompt keeps (0: none), without changing it."""

    def prefill_tail(self, slot: int, held: Head) -> int:
        """Computes the prompt in stream `slot`, which holds `held`, keeping `reusable(held)` of its cells; returns where generation continues."""

    def held_tiers(self) -> dict[str, Tier]:
        """Returns Result.tiers when the head was found in the prompt's stream: every encoding from the context."""

    def kept_head(self, answer: Answer) -> Head | None:
        """Returns what the stream holds once the prompt has ended (its head, or more), or None: nothing to keep."""

    def idle_task(self, answer: Answer) -> IdleTask | None:
        """Returns the cells worth computing for prompts like this one once the scheduler is idle, or None.

        Asked when the prompt has finished.
        """
