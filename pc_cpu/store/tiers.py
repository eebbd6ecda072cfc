"""The byte tiers as one store: an explicit ordered list, fastest first (e.g. [ram, disk]).

The one policy: a new entry is written through to every tier, so a second process finds it on
disk at once. A hit in a slower tier is promoted to the first tier; what a tier evicts is demoted
to the next one unless that tier holds it already (the last tier's evictions are dropped and will
be re-encoded). Tiers are inclusive: a promoted entry keeps its copy below, so the disk copy
survives the process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

from pc_cpu.errors import EntryTooLargeError, StoreError
from pc_cpu.store.base import Evicted, ModuleStore
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    """An entry found in the tiers, and the name of the tier that served it."""

    entry: Entry
    tier: str  # e.g. "ram" or "disk"; what a Result reports


class TieredStore:
    """Ordered byte tiers, fastest first: write-through on put, promotion on hit, demotion on eviction."""

    def __init__(self, tiers: Sequence[ModuleStore]):
        if not tiers:
            raise ValueError("TieredStore needs at least one tier, e.g. [RamStore(...), DiskStore(...)]")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct, got {names}")
        self.tiers: tuple[ModuleStore, ...] = tuple(tiers)

    def close(self) -> None:
        """Closes the tiers that hold a connection (a shared Redis); the others hold nothing to close."""
        for tier in self.tiers:
            close = getattr(tier, "close", None)
            if close is not None:
                close()

    def tier(self, name: str) -> ModuleStore:
        """Returns the tier called `name`; raises KeyError listing the valid names."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier {name!r}; tiers are {[t.name for t in self.tiers]}")

    def contains(self, key: StoreKey) -> bool:
        """Returns whether any tier holds `key`."""
        return any(t.contains(key) for t in self.tiers)

    def get(self, key: StoreKey) -> Hit | None:
        """Returns the entry and the tier that served it (looking fastest first), or None.

        A hit below the first tier is promoted to the first tier (if it fits there).
        """
        for depth, tier in enumerate(self.tiers):
            entry = tier.get(key)
            if entry is not None:
                if depth > 0:
                    self._put_from(0, key, entry, stop=depth)
                return Hit(entry, tier.name)
        return None

    def put(self, key: StoreKey, entry: Entry) -> tuple[str, ...]:
        """Writes `entry` through to every tier that accepts it; returns those tiers' names, fastest first.

        What a tier evicts to make room is demoted to the next tier (see module docstring). A
        tier whose budget is too small for the entry is logged and skipped: the entry stays
        wherever else it was stored.

        Raises:
            StoreError: a tier could not write (a full or unwritable disk): the user must fix it.
        """
        stored = []
        for depth, tier in enumerate(self.tiers):
            try:
                evicted = tier.put(key, entry)
            except EntryTooLargeError as exc:
                log.warning("%s: not stored in %s: %s", key.describe(), tier.name, exc)
                continue
            stored.append(tier.name)
            self._demote(depth + 1, evicted)
        return tuple(stored)

    def remove(self, key: StoreKey) -> bool:
        """Forgets `key` in every tier; returns whether any tier held it."""
        return any([t.remove(key) for t in self.tiers])  # a list, so every tier is visited

    def prefetch(self, keys: Iterable[StoreKey]) -> dict[StoreKey, str | None]:
        """Loads a group of modules (e.g. union members) into the first tier together.

        Members already in the first tier are touched first, so loading the others does not evict
        them; a group larger than the first tier's budget is loaded as far as it fits (logged).

        Returns:
            For each key, the tier that served it, or None for a miss (to be encoded).
        """
        keys = list(dict.fromkeys(keys))
        first = self.tiers[0]
        served: dict[StoreKey, str | None] = {}
        found: dict[StoreKey, Entry] = {}
        for key in keys:  # touch residents before anything is loaded
            entry = first.get(key)
            if entry is not None:
                served[key], found[key] = first.name, entry
        for key in keys:
            if key in served:
                continue
            hit = self._get_below(key)
            served[key] = hit.tier if hit else None
            if hit:
                found[key] = hit.entry
        total = sum(e.nbytes for e in found.values())
        if total > first.budget_bytes:
            log.warning("prefetch: group of %d modules is %d bytes > %s budget of %d bytes; "
                        "not all of it stays in %s", len(found), total, first.name, first.budget_bytes, first.name)
        for key in keys:
            if served[key] not in (None, first.name):
                self._put_from(0, key, found[key], stop=len(self.tiers))
        return served

    # -- helpers -------------------------------------------------------------------------------

    def _get_below(self, key: StoreKey) -> Hit | None:
        for tier in self.tiers[1:]:
            entry = tier.get(key)
            if entry is not None:
                return Hit(entry, tier.name)
        return None

    def _put_from(self, depth: int, key: StoreKey, entry: Entry, *, stop: int) -> None:
        """Promotes `entry` into tier `depth` (best effort) and demotes what that evicts."""
        if depth >= stop:
            return
        tier = self.tiers[depth]
        try:
            evicted = tier.put(key, entry)
        except EntryTooLargeError:
            return  # served from below; nothing to promote into
        except StoreError as exc:
            log.warning("%s: could not promote %s (%s)", tier.name, key.describe(), exc)
            return
        self._demote(depth + 1, evicted)

    def _demote(self, depth: int, evicted: list[Evicted]) -> None:
        """Puts entries evicted from tier depth-1 into tier `depth`; best effort, logged."""
        if depth >= len(self.tiers):
            for gone in evicted:
                log.debug("dropped %s from the last tier", gone.key.describe())
            return
        tier = self.tiers[depth]
        for gone in evicted:
            if gone.entry is None or tier.contains(gone.key):
                continue  # nothing to write, or the slower tier already holds these bytes
            try:
                further = tier.put(gone.key, gone.entry)
            except StoreError as exc:  # too large, or the disk refused: dropped, re-encoded later
                log.warning("%s: could not demote %s (%s); dropped", tier.name, gone.key.describe(), exc)
                continue
            self._demote(depth + 1, further)
