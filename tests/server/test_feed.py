"""Feed: a Stream iterated and closed in one worker thread, its pieces awaited on the loop (no model)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.server.feed import Done, Failed, Feed, Text


WAIT_S = 60  # a deadline for what takes milliseconds, generous for a loaded machine


class FakeStream:
    """Yields `pieces` and records the threads that iterated and closed it.

    With `gate`, every piece after the first is asked for (`asked` is set) and then served only
    once the gate is set: the test decides what is in flight when it cancels, rather than racing
    the worker.
    """

    def __init__(self, pieces, error=None, gate: threading.Event | None = None):
        self._pieces = iter(pieces)
        self._gate = gate
        self.asked = threading.Event()
        self.served = 0
        self._error = error
        self.result = None
        self.threads = set()
        self.closed_in = None

    def __iter__(self):
        return self

    def __next__(self):
        self.threads.add(threading.get_ident())
        if self._error is not None:
            raise self._error
        if self._gate is not None and self.served:
            self.asked.set()
            if not self._gate.wait(WAIT_S):
                raise TimeoutError(f"the test did not open the gate within {WAIT_S} s")
        try:
            piece = next(self._pieces)
            self.served += 1
            return piece
        except StopIteration:
            self.result = "the result"
            raise

    def close(self):
        self.closed_in = threading.get_ident()


class Harness:
    """An event loop and a worker pool to run Feeds on."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(2)

    def start(self, stream) -> Feed:
        async def make():
            return Feed(lambda: stream, self.executor)
        return self.loop.run_until_complete(make())

    def events(self, feed: Feed, limit: int = 100) -> list:
        async def collect():
            events = []
            while len(events) < limit:
                events.append(await feed.next(timeout=WAIT_S))
                if not isinstance(events[-1], Text):
                    break
            return events
        return self.loop.run_until_complete(collect())

    def close(self):
        self.executor.shutdown(wait=True)
        self.loop.close()


@pytest.fixture
def harness():
    made = Harness()
    yield made
    made.close()


def test_pieces_then_done_and_the_stream_is_closed_in_the_thread_that_iterated_it(harness):
    stream = FakeStream(["a", "b"])
    feed = harness.start(stream)
    assert harness.events(feed) == [Text("a"), Text("b"), Done("the result")]
    assert feed.finished.wait(WAIT_S) and stream.threads == {stream.closed_in}
    assert stream.closed_in != threading.get_ident()


def test_an_error_is_handed_over_as_failed(harness):
    error = PromptCacheError("bad prompt")
    feed = harness.start(FakeStream([], error=error))
    assert harness.events(feed) == [Failed(error)]
    assert feed.finished.wait(WAIT_S)


def test_cancel_closes_the_stream_after_the_piece_in_flight(harness):
    gate = threading.Event()
    stream = FakeStream(["a"] * 1000, gate=gate)
    feed = harness.start(stream)
    assert harness.events(feed, limit=1) == [Text("a")]
    assert stream.asked.wait(WAIT_S)
    feed.cancel()  # while the second piece is in flight (held at the gate)
    gate.set()
    assert feed.finished.wait(WAIT_S) and stream.closed_in is not None
    assert stream.served == 2
