"""Stream: the text pieces of one prompt's answer as they are generated, then its Result (ToolCallStream: with tools)."""

from __future__ import annotations

import dataclasses
from typing import Collection, Iterator

from pc_cpu.engine.runtime.scheduler import Failed, Request, Text
from pc_cpu.pml.tools import OPEN, could_be_bare_call, parse_tool_calls
from pc_cpu.result import Result


class Stream:
    """Iterates over a prompt's generated text pieces; `.result` holds the Result once it ends."""

    def __init__(self, request: Request):
        self._request = request
        self.result: Result | None = None
        self.piece_logprobs: tuple[dict, ...] = ()  # with logprobs asked for: those of the last piece's tokens
        self._done = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        event = self._request.events.get()
        if isinstance(event, Text):
            self.piece_logprobs = event.logprobs
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


class ToolCallStream:
    """A chat Stream given tools: yields the answer's text before its first call; `.result` holds the calls.

    Text that may be the start of a call's opening is held back until it is known not to be, so a
    client never sees call markup; once a call opens, the rest of the answer is read as calls
    when it ends (pc_cpu.pml.tools.parse_tool_calls). An answer that starts as JSON may be a bare
    call: it is held back until it is known. An answer in which no call parses is text after all:
    what was held back is yielded at its end.
    """

    def __init__(self, stream: Stream, names: Collection[str]):
        self._stream = stream
        self._names = tuple(names)  # the tools': an answer that is only a JSON call to one is a call too
        self._text = ""  # everything generated so far
        self._sent = 0  # characters of it yielded
        self._calling = False
        self._logprobs: list[dict] = []  # of the pieces not yielded yet
        self.piece_logprobs: tuple[dict, ...] = ()
        self.result: Result | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while True:
            try:
                piece = next(self._stream)
            except StopIteration:
                self._finish()
                rest = self.result.text[self._sent:] if not self.result.tool_calls else ""
                self._sent += len(rest)
                if rest:
                    return self._yield(rest)
                raise
            self._text += piece
            self._logprobs += self._stream.piece_logprobs
            if self._calling or (self._sent == 0 and could_be_bare_call(self._text)):
                continue
            opened = self._text.find(OPEN, self._sent)
            if opened >= 0:
                self._calling = True
                ready = self._text[self._sent:opened]
            else:
                ready = self._text[self._sent:len(self._text) - _held_back(self._text, OPEN)]
            self._sent += len(ready)
            if ready:
                return self._yield(ready)

    def _yield(self, text: str) -> str:
        self.piece_logprobs, self._logprobs = tuple(self._logprobs), []
        return text

    def _finish(self) -> None:
        """Sets the Result: with calls, its text is what was yielded before them (a call cut short by max_tokens is
        dropped); without, the whole answer, the rest of which is then yielded."""
        result = self._stream.result
        _, calls = parse_tool_calls(result.text, self._names)
        if not calls:
            self.result = result
            return
        reason = "tool_calls" if result.finish_reason == "stop" else result.finish_reason
        self.result = dataclasses.replace(result, text=result.text[:self._sent].strip(), finish_reason=reason,
                                          tool_calls=[call.openai() for call in calls])

    def close(self) -> None:
        """Cancels the prompt if it is still running, as Stream.close does."""
        self._stream.close()


def _held_back(text: str, opening: str) -> int:
    """Returns how many last characters of `text` could begin `opening` (kept back until the next piece says)."""
    for n in range(min(len(opening) - 1, len(text)), 0, -1):
        if opening.startswith(text[-n:]):
            return n
    return 0
