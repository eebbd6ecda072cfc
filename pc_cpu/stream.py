"""Stream: the text pieces of one prompt's answer as they are generated, then its Result."""

from __future__ import annotations

from typing import Iterator

from pc_cpu.engine.runtime.scheduler import Failed, Request, Text
from pc_cpu.result import Result


class Stream:
    """Iterates over a prompt's generated text pieces; `.result` holds the Result once it ends."""

    def __init__(self, request: Request):
        self._request = request
        self.result: Result | None = None
        self._done = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        event = self._request.events.get()
        if isinstance(event, Text):
            return event.text
        self._done = True
        if isinstance(event, Failed):
            raise event.error
        self.result = event.result
        raise StopIteration

    def close(self) -> None:
        """Cancels the prompt if it is still running (its slot and cells are freed)."""
        if not self._done:
            self._request.cancelled.set()
            self._done = True

    def __del__(self) -> None:
        self.close()
