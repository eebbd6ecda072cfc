"""Gives the tokens a model generates after an assembled prompt: sample, stream, stop."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterator, Sequence

from pc_cpu.engine.context import Context
from pc_cpu.engine.sampler import Sampler


@dataclass(frozen=True)
class Step:
    """One generated token and the text it releases (may be empty while bytes or a stop string pend)."""

    token: int
    text: str


@dataclass
class Finish:
    reason: str = "length"  # "stop" (end-of-generation token or stop string) or "length"


def generate_tokens(ctx: Context, sampler: Sampler, *, seq: int, next_pos: int, max_tokens: int,
                    stop: Sequence[str] = (), finish: Finish | None = None) -> Iterator[Step]:
    """Yields generated tokens from the logits the last decode left, until EOG, a stop string or max_tokens.

    Text is released only when it can no longer turn into a stop string and its
    UTF-8 bytes are complete; text from a stop string on is never released.
    """
    finish = finish or Finish()
    model = ctx.model
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text, released = "", 0
    hold = max((len(s) for s in stop), default=1) - 1
    for i in range(max_tokens):
        token = sampler.sample(ctx.handle)
        if model.is_end_of_generation(token):
            finish.reason = "stop"
            break
        text += utf8.decode(model.piece(token))
        cut = _first_stop(text, stop, released)
        if cut is not None:
            finish.reason = "stop"
            yield Step(token, text[released:cut])
            return
        safe = max(released, len(text) - hold)
        yield Step(token, text[released:safe])
        released = safe
        if i + 1 < max_tokens:
            ctx.decode([token], [next_pos], seq)
            next_pos += 1
    tail = text[released:] + utf8.decode(b"", final=True)
    if tail:
        yield Step(-1, tail)  # flushes held-back text; token -1 marks "no new token"


def _first_stop(text: str, stop: Sequence[str], released: int) -> int | None:
    """Returns where the first stop string starts in the unreleased text, or None."""
    starts = [text.find(s, max(0, released - len(s))) for s in stop if s]
    starts = [s for s in starts if s >= 0]
    return min(starts) if starts else None
