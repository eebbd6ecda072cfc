"""Gives the command line's view of encoding progress: a bar on stderr when it is a terminal, one line otherwise."""

from __future__ import annotations

import sys
from typing import TextIO

import click

from pc_cpu.progress import EncodeProgress


class EncodeProgressBar:
    """A `progress` callback for PromptCache.load_schema and add_document that draws on `file` (stderr by default).

    On a terminal: a bar per schema or document (tokens done of all, the encoding under way,
    tokens/s), then its summary line ("loaded schema ...", "encoded document ..."). Elsewhere
    (a log file, a pipe): the summary line only, when it is done, so logs get one line per
    schema or document. One done within `quiet_s` seconds (restored from the store, or small)
    shows nothing: only a wait needs explaining.
    """

    def __init__(self, file: TextIO | None = None, *, bar: bool | None = None, quiet_s: float = 1.0):
        self.file = file or sys.stderr
        self.bar = self.file.isatty() if bar is None else bar
        self.quiet_s = quiet_s
        self._drawn = None  # the click ProgressBar of the schema under way
        self._shown = 0  # tokens the bar shows

    def __call__(self, event: EncodeProgress) -> None:
        if event.seconds < self.quiet_s:
            return
        if self.bar and event.tokens_total:
            if self._drawn is None:
                what = event.schema if event.kind == "schema" else f"{event.kind} {event.schema}"
                self._drawn = click.progressbar(length=event.tokens_total, label=f"encoding {what}",
                                                file=self.file, show_pos=True, item_show_func=_describe)
                self._shown = 0
            self._drawn.update(event.tokens_done - self._shown, event)
            self._shown = event.tokens_done
        if event.finished:
            if self._drawn is not None:
                self._drawn.render_finish()
                self._drawn = None
            click.echo(f"{_DONE[event.kind]} {event.summary()}", file=self.file)


# The done line's verb: a schema's modules may have come from the store; a document reports only when computed.
_DONE = {"schema": "loaded", "document": "encoded"}


def _describe(event: EncodeProgress | None) -> str:
    return f"{event.module} {event.tokens_per_s:.0f} tokens/s" if event is not None else ""
