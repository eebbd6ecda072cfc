"""Tier 0: which library sequence of the context holds each encoded module.

Sequence ids are a budget (at most 256 per context), so modules whose positions
do not overlap share one "library" sequence: a later seq_cp takes a position
range, so each module's cells can still be shared on their own. Union members
overlap by design and land in different library sequences. This class is pure
bookkeeping, testable without a model; the engine does the llama.cpp calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from pc_cpu.errors import SequenceBudgetError

ModuleKey = Hashable  # the engine uses content keys (pc_cpu.store.keys.StoreKey); anything with `label` is named by it
Interval = tuple[int, int]  # positions [start, end)


@dataclass
class _Library:
    seq: int
    intervals: dict[ModuleKey, tuple[Interval, ...]] = field(default_factory=dict)

    def overlaps(self, wanted: tuple[Interval, ...]) -> bool:
        return any(a < d and c < b for held in self.intervals.values() for (a, b) in held for (c, d) in wanted)


class ResidentTier:
    """Places modules into library sequences and remembers where each one is."""

    def __init__(self, library_seqs: list[int]):
        self._libraries = [_Library(seq) for seq in library_seqs]
        self._where: dict[ModuleKey, _Library] = {}
        self.cells = 0  # KV cells held by resident modules, kept current on put/remove

    def contains(self, key: ModuleKey) -> bool:
        return key in self._where

    def get(self, key: ModuleKey) -> int | None:
        """Returns the library sequence holding `key`, or None."""
        library = self._where.get(key)
        return library.seq if library else None

    def touch(self, key: ModuleKey) -> None:
        """Marks `key` as just used: it becomes the last to be evicted."""
        self._where[key] = self._where.pop(key)

    def least_recent(self) -> list[ModuleKey]:
        """Returns the resident keys, least recently used (put or touched) first."""
        return list(self._where)

    def intervals(self, key: ModuleKey) -> tuple[Interval, ...]:
        """Returns the positions `key` holds cells at."""
        return self._where[key].intervals[key]

    def fits(self, intervals: tuple[Interval, ...]) -> bool:
        """Returns True when some library sequence holds nothing at `intervals` (put would succeed)."""
        return any(not library.overlaps(intervals) for library in self._libraries)

    def put(self, key: ModuleKey, intervals: tuple[Interval, ...]) -> int:
        """Returns the library sequence chosen for a module occupying `intervals` (first fit).

        Raises:
            SequenceBudgetError: every library sequence already holds cells at those positions.
        """
        if key in self._where:
            raise ValueError(f"module {key} is already resident")
        for library in self._libraries:
            if not library.overlaps(intervals):
                library.intervals[key] = intervals
                self._where[key] = library
                self.cells += sum(b - a for a, b in intervals)
                return library.seq
        raise SequenceBudgetError(
            f"no free sequence for {getattr(key, 'label', None) or key!r}: {len(self._libraries)} library "
            "sequences already hold modules at its positions (union members need one each); raise n_seq_max "
            "or unload a schema")

    def remove(self, key: ModuleKey) -> tuple[int, tuple[Interval, ...]]:
        """Forgets `key`; returns (sequence, intervals) so the engine can drop those cells."""
        library = self._where.pop(key)
        intervals = library.intervals.pop(key)
        self.cells -= sum(b - a for a, b in intervals)
        return library.seq, intervals

    def held_within(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Returns (sequence, start, end) of every resident interval overlapping [start, end), clipped to it."""
        return [(library.seq, max(a, start), min(b, end)) for library in self._libraries
                for held in library.intervals.values() for a, b in held if a < end and start < b]

    def idle_seqs(self) -> list[int]:
        """Returns the library sequences that hold no module (free for scratch work until the next put)."""
        return [library.seq for library in self._libraries if not library.intervals]

    def keys(self) -> list[ModuleKey]:
        """Returns the resident encodings' keys."""
        return list(self._where)
