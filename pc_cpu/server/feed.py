"""Gives a Feed: one PromptCache Stream run in a worker thread, its pieces awaited on the event loop.

Why a thread of its own per stream: a Stream holds the context (today: PromptCache's lock, which
belongs to the thread that took it) from its first piece until it is exhausted or closed, so it
must be iterated and closed in one thread, and never on the event loop. The Feed owns the Stream:
`cancel()` (a client went away, the server stops) makes the worker close it after the piece in
flight, which frees the prompt's sequence.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Executor
from typing import Callable

from pc_cpu.engine.runtime.scheduler import Done, Event, Failed, Text  # the same events the scheduler emits

log = logging.getLogger(__name__)


class Feed:
    """Runs `open_stream()` in `executor` and hands its pieces, then Done or Failed, to `next()`.

    Create it on the event loop that will await `next()`.
    """

    def __init__(self, open_stream: Callable[[], object], executor: Executor):
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.finished = threading.Event()  # set once the worker has closed the stream
        executor.submit(self._work, open_stream)

    async def next(self, timeout: float | None = None) -> Event | None:
        """Returns the next event; None when `timeout` (seconds) passes first."""
        try:
            return await asyncio.wait_for(self._events.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def cancel(self) -> None:
        """Asks the worker to close the stream after the piece in flight; safe from any thread, repeatable."""
        self._cancelled.set()

    def _work(self, open_stream) -> None:
        stream = None
        try:
            if self._cancelled.is_set():
                return  # cancelled while queued for a worker: never take the context
            stream = open_stream()
            for text in stream:
                self._post(Text(text, getattr(stream, "piece_logprobs", ())))
                if self._cancelled.is_set():
                    return
            self._post(Done(stream.result))
        except Exception as exc:  # handed to the request, which turns it into an HTTP error
            self._post(Failed(exc))
        finally:
            if stream is not None:
                stream.close()  # same thread that iterated it: releases the context
            self.finished.set()

    def _post(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self._cancelled.set()
