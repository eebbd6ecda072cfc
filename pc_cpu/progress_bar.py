"""Gives the command line's view of encoding progress: a bar on stderr when it is a terminal, one line otherwise."""

from __future__ import annotations

import sys
from typing import TextIO

import click

from pc_cpu.progress import EncodeProgress


class EncodeProgressBar:
    """A `progress` callback for PromptCache.load_schema that draws on `file` (stderr by default).

    On a terminal: a bar per schema (tokens done of all, the module under way, tokens/s),
    then its summary line. Elsewhere (a log file, a pipe): the summary line only, when
    the schema is done, so logs get one line per schema. A schema done within `quiet_s`
    seconds (restored from the store, or small) shows nothing: only a wait needs explaining.
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
                self._drawn = click.progressbar(length=event.tokens_total, label=f"encoding {event.schema}",
                                                file=self.file, show_pos=True, item_show_func=_describe)
                self._shown = 0
            self._drawn.update(event.tokens_done - self._shown, event)
            self._shown = event.tokens_done
        if event.finished:
            if self._drawn is not None:
                self._drawn.render_finish()
                self._drawn = None
            click.echo(f"loaded {event.summary()}", file=self.file)


def _describe(event: EncodeProgress | None) -> str:
    return f"{event.module} {event.tokens_per_s:.0f} tokens/s" if event is not None else ""
