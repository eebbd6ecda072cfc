"""The CLI's progress display: a bar on a terminal, one summary line per schema in a log, nothing for quick loads."""

from __future__ import annotations

import io

from pc_cpu.progress import EncodeProgress, ProgressTracker
from pc_cpu.progress_bar import EncodeProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def encode_events(seconds_per_step: float) -> list[EncodeProgress]:
    """Returns the events of a schema of two modules (600 + 10 tokens), the first computed in two batches."""
    clock = iter(range(100))
    events: list[EncodeProgress] = []
    tracker = ProgressTracker("trip", {"long": 600, "short": 10}, events.append,
                              clock=lambda: next(clock) * seconds_per_step)
    tracker.computed("long", 512)
    tracker.computed("long", 88)
    tracker.finished("long")
    tracker.finished("short")
    return events


def test_tracker_counts_batches_then_whole_encodings():
    events = encode_events(1.0)
    assert [(e.module, e.modules_done, e.tokens_done, e.seconds) for e in events] == [
        ("long", 0, 512, 1.0), ("long", 0, 600, 2.0), ("long", 1, 600, 3.0), ("short", 2, 610, 4.0)]
    assert [e.finished for e in events] == [False, False, False, True]
    assert events[-1].tokens_per_s == 610 / 4.0
    assert events[-1].summary() == "schema 'trip': 2 of 2 modules, 610 tokens in 4.0 s (152 tokens/s)"


def test_a_log_gets_one_line_per_schema():
    log = io.StringIO()
    show = EncodeProgressBar(log)
    for event in encode_events(1.0):
        show(event)
    assert log.getvalue() == "loaded schema 'trip': 2 of 2 modules, 610 tokens in 4.0 s (152 tokens/s)\n"


def test_a_terminal_gets_a_bar_that_reaches_the_total():
    terminal = Terminal()
    show = EncodeProgressBar(terminal)
    for event in encode_events(1.0):
        show(event)
    drawn = terminal.getvalue()
    assert "encoding trip" in drawn and "512/610" in drawn and "610/610" in drawn and "long" in drawn
    assert drawn.rstrip().endswith("loaded schema 'trip': 2 of 2 modules, 610 tokens in 4.0 s (152 tokens/s)")


def test_a_quick_load_shows_nothing():
    terminal = Terminal()
    show = EncodeProgressBar(terminal, quiet_s=1.0)
    for event in encode_events(0.1):
        show(event)
    assert terminal.getvalue() == ""


def test_a_document_is_drawn_and_logged_as_encoded():
    clock = iter(range(100))
    events: list[EncodeProgress] = []
    tracker = ProgressTracker("notes.md", {"doc-1": 1612}, events.append, clock=lambda: next(clock) * 4.1,
                              kind="document")
    tracker.computed("doc-1", 512)
    tracker.computed("doc-1", 1100)
    tracker.finished("doc-1")
    log, terminal = io.StringIO(), Terminal()
    for show in (EncodeProgressBar(log), EncodeProgressBar(terminal)):
        for event in events:
            show(event)
    assert log.getvalue() == "encoded document 'notes.md': 1,612 tokens in 12.3 s (131 tokens/s)\n"
    assert "encoding document notes.md" in terminal.getvalue() and "512/1612" in terminal.getvalue()
