"""Gives the text a request may release as its tokens arrive: whole characters, never a stop string."""

from __future__ import annotations

import codecs
from typing import Sequence

from pc_cpu.engine.llama.model import Model


class TextDecoder:
    """Turns one request's generated tokens into releasable text and notices its stop strings.

    Text is released only once its UTF-8 bytes are complete and it can no longer
    become the start of a stop string; text from a stop string on is never released.
    """

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self._model = model
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._released = 0
        self.stopped = False  # a stop string appeared

    def push(self, token: int) -> str:
        """Adds a generated token; returns the text that became safe to release."""
        self._text += self._utf8.decode(self._model.piece(token))
        cut = self._first_stop()
        if cut is not None:
            self.stopped = True
            return self._release(cut)
        return self._release(max(self._released, len(self._text) - self._hold))

    def flush(self) -> str:
        """Returns the text still held back (call once generation ends without a stop string)."""
        if self.stopped:
            return ""
        self._text += self._utf8.decode(b"", final=True)
        return self._release(len(self._text))

    def _release(self, upto: int) -> str:
        piece = self._text[self._released:upto]
        self._released = upto
        return piece

    def _first_stop(self) -> int | None:
        """Returns where the first stop string starts in the text not yet released, or None."""
        starts = [self._text.find(s, max(0, self._released - len(s))) for s in self._stop]
        starts = [s for s in starts if s >= 0]
        return min(starts) if starts else None
