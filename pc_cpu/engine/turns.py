"""FairLock: a reentrant lock that threads get in the order they asked for it.

The scheduler's worker takes the context's lock for every decode step and asks
again right after. Python's locks let the releasing thread barge back in, so a
caller waiting to plan a prompt or load a schema could wait until generation
ends. With turns, a waiting thread gets the lock after at most one step.
"""

from __future__ import annotations

import threading
import time


class FairLock:
    """A reentrant lock granted first come, first served."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
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
