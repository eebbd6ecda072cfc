"""FairLock: a reentrant lock that threads get in the order they asked for it; ContextLocks: a cache's two locks.

The scheduler's worker takes the context's lock for every decode step and asks
again right after. Python's locks let the releasing thread barge back in, so a
caller waiting to plan a prompt or load a schema could wait until generation
ends. With turns, a waiting thread gets the lock after at most one step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class FairLock:
    """A reentrant lock granted first come, first served."""

    def __init__(self) -> None:
        mutex = threading.Lock()
        self._cond = threading.Condition(mutex)
        self._queued = threading.Condition(mutex)  # wakes wait_for_waiters, never a thread waiting for its turn
        self._next_ticket = 0
        self._serving = 0  # the ticket whose turn it is
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queued.notify_all()
            while self._serving != ticket or self._owner is not None:
                self._cond.wait()
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._serving += 1
                self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Returns how many threads wait for the lock now, its holder not counted (for tests and tools)."""
        with self._cond:
            return self._waiting()

    def wait_for_waiters(self, n: int, timeout: float) -> bool:
        """Returns True once at least `n` threads wait for the lock; False when `timeout` seconds pass first.

        For a test that holds the lock and must know another thread has asked for it before it
        gives way (yield_turn): a sleep only makes that likely.
        """
        with self._queued:
            return self._queued.wait_for(lambda: self._waiting() >= n, timeout)

    def _waiting(self) -> int:
        # Every ticket from the one served on is a thread waiting, but the holder's (call holding _cond).
        return self._next_ticket - self._serving - (self._owner is not None)

    @property
    def nested(self) -> bool:
        """Returns whether the calling thread holds the lock more than once (then it cannot pause or yield)."""
        with self._cond:
            return self._owner == threading.get_ident() and self._depth > 1

    def pause(self, seconds: float) -> None:
        """Returns holding the lock again after releasing it for `seconds` and letting in whoever came meanwhile.

        A no-op when held more than once (an outer holder expects no interruption).
        """
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock.pause by a thread that does not hold it")
            if self._depth > 1:
                return
        self.release()
        time.sleep(seconds)
        self.acquire()

    def yield_turn(self) -> None:
        """Returns holding the lock again after every thread already waiting for it had its turn.

        For long work done in steps (encoding a document batch by batch): between two steps the
        scheduler decodes, so running prompts wait for one step, not for the whole work. A no-op
        when nobody waits, or when held more than once (an outer holder expects no interruption).
        """
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock.yield_turn by a thread that does not hold it")
            if self._depth > 1 or self._next_ticket == self._serving + 1:
                return
        self.release()
        self.acquire()

    def __enter__(self) -> "FairLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ContextLocks:
    """The two locks of one PromptCache, and the order they are taken in: the adder's stream, then the context.

    `context` (a FairLock): one thread at a time calls into llama.cpp, in arrival order.
    The adder's stream (SequenceRoles.adder) is where add_document and a schema's precompute
    compute between prompts' steps; one of them at a time. An add holds the stream and waits
    for the context; nothing waits for the stream while holding the context (`try_adder`), so
    the two never deadlock.
    """

    def __init__(self) -> None:
        self.context = FairLock()
        self._adder = threading.Lock()

    @contextlib.contextmanager
    def adding(self) -> Iterator[None]:
        """Holds the adder's stream, then the context, for as long as the block runs (add_document)."""
        with self._adder, self.context:
            yield

    @contextlib.contextmanager
    def adder_if_free(self) -> Iterator[bool]:
        """Yields whether the adder's stream was taken for the block: never waits, so it may run under the context.

        False, and nothing taken, when the stream is busy or the caller holds the context more
        than once (a precompute yields the context between batches, which a nested holder cannot).
        """
        taken = not self.context.nested and self._adder.acquire(blocking=False)
        try:
            yield taken
        finally:
            if taken:
                self._adder.release()
