"""Wilson intervals and paired differences on hand-checked numbers."""

import math

import numpy as np
import pytest

from pc_cpu.benchmarks.intervals import discordant, paired_difference, wilson


def test_wilson_matches_the_textbook_value():
    iv = wilson(34, 120)  # 28.3%
    assert iv.estimate == pytest.approx(34 / 120)
    assert iv.low == pytest.approx(0.2104, abs=5e-4)
    assert iv.high == pytest.approx(0.3697, abs=5e-4)


def test_wilson_stays_inside_zero_one_at_the_edges():
    assert wilson(0, 10).low == 0.0 and 0 < wilson(0, 10).high < 0.35
    assert wilson(10, 10).high == 1.0 and wilson(10, 10).low > 0.65


def test_wilson_of_nothing_is_nan():
    assert math.isnan(wilson(0, 0).estimate)


def test_identical_scores_have_a_zero_width_difference():
    iv = paired_difference([1, 0, 1, 1], [1, 0, 1, 1])
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)


def test_paired_difference_is_the_mean_and_brackets_it():
    variant = [1] * 30 + [0] * 70
    baseline = [1] * 50 + [0] * 50
    iv = paired_difference(variant, baseline, seed=3)
    assert iv.estimate == pytest.approx(-0.2)
    assert iv.low < -0.2 < iv.high < 0  # 20 losses, no wins: clearly below zero


def test_paired_difference_is_deterministic_for_a_seed_and_the_seed_decides_it():
    # Real-valued scores, so every resample's mean differs and the bounds move with the draws (with a
    # few 0/1 scores the bounds fall on the same few values whatever is drawn, seeded or not).
    variant = [(i * 0.37) % 1 for i in range(30)]
    baseline = [(i * 0.61) % 1 for i in range(30)]
    first = paired_difference(variant, baseline, seed=7)
    np.random.seed(1)  # numpy's global generator must not matter
    assert paired_difference(variant, baseline, seed=7) == first
    assert first not in {paired_difference(variant, baseline, seed=s) for s in (8, 9)}  # other draws
    assert first.low < first.estimate < first.high


def test_paired_difference_rejects_unpaired_lengths():
    with pytest.raises(ValueError, match="equal"):
        paired_difference([1, 0], [1])


def test_discordant_counts_wins_and_losses():
    assert discordant([1, 1, 0, 0], [0, 1, 1, 0]) == (1, 1)
    assert discordant([True, True], [False, False]) == (2, 0)
