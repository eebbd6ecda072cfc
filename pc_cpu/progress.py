"""Gives the progress of encoding a schema or a document: the event an app's callback receives, and the tracker that makes it.

    def show(p: EncodeProgress) -> None:
        print(f"{p.tokens_done}/{p.tokens_total} tokens, {p.tokens_per_s:.0f} tokens/s")

    pc.load_schema(pml, progress=show)
    pc.add_document(text, name="notes.md", progress=show)

Events come in the thread that calls `load_schema` (or `add_document`), after each batch of
computed tokens (n_batch, 512 by default) and after each encoding is done; the last one has
`finished` set. A schema reports every encoding, whether it was computed or came back from the
RAM or disk tier; a document reports only when it is computed (one found in a tier has nothing
to wait for).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from pc_cpu.errors import CancelledError


@dataclass(frozen=True)
class EncodeProgress:
    """How far encoding one schema (or one document) has got."""

    schema: str  # the schema's name; for a document, its name (its id when it has none)
    module: str  # the encoding being worked on: a module name, "scaffold:<name>" for a joint encoding, a document id
    modules_done: int
    modules_total: int
    tokens_done: int  # cached tokens of the finished encodings plus those computed of the current one
    tokens_total: int
    seconds: float  # since the schema's encoding began
    kind: str = "schema"  # or "document" (PromptCache.add_document): one encoding, the document's tokens

    @property
    def finished(self) -> bool:
        return self.modules_done == self.modules_total

    @property
    def tokens_per_s(self) -> float:
        """Returns the tokens done per second so far (restored tokens count too: they are done)."""
        return self.tokens_done / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """Returns one line for logs, e.g. "schema 'trip': 3 of 3 modules, 4700 tokens in 23.1 s (203 tokens/s)".

        A document's has no module count: "document 'notes.md': 1,612 tokens in 12.3 s (131 tokens/s)".
        """
        if self.kind == "document":
            return (f"document {self.schema!r}: {self.tokens_done:,} tokens in {self.seconds:.1f} s "
                    f"({self.tokens_per_s:.0f} tokens/s)")
        return (f"schema {self.schema!r}: {self.modules_done} of {self.modules_total} modules, {self.tokens_done} "
                f"tokens in {self.seconds:.1f} s ({self.tokens_per_s:.0f} tokens/s)")


ProgressCallback = Callable[[EncodeProgress], None]


class ProgressTracker:
    """Turns "these tokens were computed" and "this encoding is done" into EncodeProgress events."""

    def __init__(self, schema: str, tokens_by_key: Mapping[str, int], callback: ProgressCallback | None, *,
                 clock: Callable[[], float] = time.perf_counter, kind: str = "schema"):
        """
        Args:
            schema: the schema's name (a document's name, for kind "document").
            tokens_by_key: the cached tokens of each encoding to do, in the order they are done.
            callback: receives each event; None only keeps count (for `last`).
            clock: seconds, monotonic.
            kind: what is encoded, "schema" or "document" (EncodeProgress.kind).
        """
        self.schema = schema
        self.kind = kind
        self._tokens_by_key = dict(tokens_by_key)
        self._callback = callback
        self._clock = clock
        self._start = clock()
        self._done_keys = 0
        self._done_tokens = 0  # of finished encodings
        self._current = 0  # tokens computed so far of the encoding under way
        self.last = self._event(next(iter(self._tokens_by_key), ""), 0.0)  # nothing done yet

    def computed(self, key: str, n_tokens: int) -> None:
        """Counts `n_tokens` more computed tokens of encoding `key` and reports."""
        self._current = min(self._current + n_tokens, self._tokens_by_key.get(key, 0))
        self._emit(key)

    def finished(self, key: str) -> None:
        """Counts encoding `key` as done (computed or restored) and reports."""
        self._done_keys += 1
        self._done_tokens += self._tokens_by_key.get(key, 0)
        self._current = 0
        self._emit(key)

    def _emit(self, key: str) -> None:
        self.last = self._event(key, self._clock() - self._start)
        if self._callback is not None:
            self._callback(self.last)

    def _event(self, key: str, seconds: float) -> EncodeProgress:
        return EncodeProgress(self.schema, key, self._done_keys, len(self._tokens_by_key),
                              self._done_tokens + self._current, sum(self._tokens_by_key.values()), seconds,
                              self.kind)


def check_cancel(cancel: threading.Event | None, what: str, outcome: str,
                 error: type[CancelledError] = CancelledError) -> None:
    """Raises `error` when `cancel` is set: its caller went away, so `what` stops here (`outcome` says with what)."""
    if cancel is not None and cancel.is_set():
        raise error(f"{what} was cancelled; {outcome}")


def paced(report: Callable[[int], None], give_way: Callable[[float], None]) -> Callable[[int], None]:
    """Returns what a long encoding calls after each batch of n tokens: `report(n)` (it may raise to stop),
    then `give_way(seconds)` for as long as the batch took, so running prompts are never stalled by it."""
    started = [time.perf_counter()]

    def after_batch(n: int) -> None:
        report(n)
        give_way(time.perf_counter() - started[0])
        started[0] = time.perf_counter()

    return after_batch
