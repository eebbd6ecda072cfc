"""Tests of Segment (pc_cpu.pml.segment): where a segment's runs are computed and where they go."""

from __future__ import annotations

import pytest

from pc_cpu.pml.layout import Run
from pc_cpu.pml.segment import Segment


def test_one_run_is_computed_where_it_stays():
    segment = Segment("doc", (Run(5, (1, 2, 3)),), context=(7, 8))

    assert (segment.start, segment.end, segment.first_position) == (5, 8, 3)
    assert segment.computed_starts() == (5,)
    assert segment.tokens == (1, 2, 3) and segment.n_tokens == 3


def test_later_runs_are_computed_right_after_the_run_before_them():
    segment = Segment("scaffold:k", (Run(3, (1, 2)), Run(9, (3,)), Run(12, (4, 5))), context=(6, 7, 8))

    assert segment.computed_starts() == (3, 5, 6)  # then moved to 9 and 12
    assert segment.tokens == (1, 2, 3, 4, 5)
    assert (segment.start, segment.end, segment.first_position) == (3, 14, 0)


def test_moved_keeps_the_runs_apart_and_shares_no_context():
    segment = Segment("m", (Run(10, (1,)), Run(13, (2,))), context=(9, 9), shared_context=(("#root", 8, 10),),
                      after="n")

    home = segment.moved(8)

    assert [(r.start, r.tokens) for r in home.runs] == [(2, (1,)), (5, (2,))]
    assert (home.first_position, home.context, home.shared_context, home.after) == (0, (9, 9), (), "n")
    assert segment.moved(0) is segment


def test_a_segment_without_runs_is_refused():
    with pytest.raises(ValueError, match="segment 'x' has no runs"):
        Segment("x", ())
