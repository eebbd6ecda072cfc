"""Tests of tier 0 bookkeeping (pc_cpu.store.resident): which library sequence holds each module."""

from __future__ import annotations

import pytest

from pc_cpu.errors import EngineError, SequenceBudgetError
from pc_cpu.store.resident import ResidentTier


def test_first_fit_puts_the_first_module_in_the_first_library():
    tier = ResidentTier([4, 5, 6])

    assert tier.put(("s", "a"), ((0, 10),)) == 4
    assert tier.contains(("s", "a"))
    assert tier.get(("s", "a")) == 4
    assert tier.cells == 10


def test_modules_that_do_not_overlap_share_a_sequence():
    tier = ResidentTier([4, 5])

    assert tier.put(("s", "root"), ((0, 3),)) == 4
    assert tier.put(("s", "a"), ((3, 8),)) == 4  # touching at 3 is not overlapping: ranges are half-open
    assert tier.put(("s", "b"), ((8, 9), (12, 15))) == 4
    assert tier.cells == 3 + 5 + 1 + 3


def test_union_members_get_different_sequences():
    tier = ResidentTier([4, 5, 6])

    assert tier.put(("trip", "paris"), ((10, 13),)) == 4
    assert tier.put(("trip", "tokyo"), ((10, 11),)) == 5
    assert tier.put(("trip", "rome"), ((10, 12),)) == 6


def test_first_fit_takes_the_lowest_library_without_overlap():
    tier = ResidentTier([4, 5, 6])
    tier.put(("trip", "paris"), ((10, 13),))
    tier.put(("trip", "tokyo"), ((10, 11),))

    assert tier.put(("trip", "rome"), ((12, 14),)) == 5
    assert tier.put(("trip", "oslo"), ((10, 12),)) == 6


def test_intervals_overlap_when_any_pair_overlaps():
    tier = ResidentTier([1, 2])
    tier.put(("s", "a"), ((0, 2), (20, 30)))

    assert tier.put(("s", "b"), ((5, 6), (29, 31))) == 2
    assert tier.put(("s", "c"), ((2, 20), (30, 40))) == 1


def test_budget_exhaustion_names_the_module_and_the_fix():
    tier = ResidentTier([4, 5])
    tier.put(("trip", "paris"), ((10, 13),))
    tier.put(("trip", "tokyo"), ((10, 11),))

    with pytest.raises(SequenceBudgetError) as info:
        tier.put(("trip", "rome"), ((10, 12),))

    message = str(info.value)
    assert "no free sequence for ('trip', 'rome')" in message
    assert "2 library sequences already hold modules at its positions" in message
    assert "raise n_seq_max or unload a schema" in message
    assert isinstance(info.value, EngineError)
    assert not tier.contains(("trip", "rome"))
    assert tier.cells == 4


def test_no_libraries_at_all():
    with pytest.raises(SequenceBudgetError, match="0 library sequences"):
        ResidentTier([]).put(("s", "a"), ((0, 1),))


def test_putting_a_resident_module_again_is_refused():
    tier = ResidentTier([4, 5])
    tier.put(("s", "a"), ((0, 1),))

    with pytest.raises(ValueError, match="already resident"):
        tier.put(("s", "a"), ((5, 6),))
    assert tier.cells == 1


def test_remove_returns_the_sequence_and_intervals_and_frees_them():
    tier = ResidentTier([4, 5])
    tier.put(("s", "a"), ((0, 3), (7, 9)))
    tier.put(("s", "b"), ((1, 2),))

    assert tier.remove(("s", "a")) == (4, ((0, 3), (7, 9)))
    assert tier.cells == 1
    assert not tier.contains(("s", "a"))
    assert tier.get(("s", "a")) is None
    assert tier.put(("s", "c"), ((0, 3),)) == 4  # the freed positions are usable again


def test_remove_of_an_unknown_module_raises_key_error():
    with pytest.raises(KeyError):
        ResidentTier([4]).remove(("s", "nope"))


def test_keys_lists_every_resident_encoding_in_put_order():
    tier = ResidentTier([4, 5])
    tier.put(("s", "a"), ((0, 1),))
    tier.put(("t", "a"), ((0, 1),))
    tier.put(("s", "b"), ((1, 2),))

    assert tier.keys() == [("s", "a"), ("t", "a"), ("s", "b")]


def test_module_without_cells_fits_anywhere():
    tier = ResidentTier([4])
    tier.put(("s", "a"), ((0, 10),))

    assert tier.put(("s", "parent"), ()) == 4
    assert tier.cells == 10


def test_held_within_clips_every_resident_interval_that_overlaps_the_span():
    tier = ResidentTier([4, 5])
    tier.put(("trip", "root"), ((0, 10), (20, 25)))
    tier.put(("trip", "paris"), ((10, 13),))
    tier.put(("trip", "tokyo"), ((10, 11),))

    assert sorted(tier.held_within(8, 21)) == [(4, 8, 10), (4, 10, 13), (4, 20, 21), (5, 10, 11)]
    assert tier.held_within(13, 20) == []
    tier.remove(("trip", "paris"))
    assert sorted(tier.held_within(8, 21)) == [(4, 8, 10), (4, 20, 21), (5, 10, 11)]
