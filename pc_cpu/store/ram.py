"""Tier 1: computed cells (modules, documents, conversation turns) held as bytes in process memory, LRU within a byte budget."""

from __future__ import annotations

import logging
from collections import OrderedDict

from pc_cpu.errors import EntryTooLargeError
from pc_cpu.store.base import ByteBudget, Evicted
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey

log = logging.getLogger(__name__)


class RamStore(ByteBudget):
    """A dict of entries in LRU order (oldest first) whose payload bytes (ByteBudget) stay within a budget."""

    def __init__(self, budget_bytes: int, *, name: str = "ram"):
        if budget_bytes < 0:
            raise ValueError(f"RAM store budget must be >= 0 bytes, got {budget_bytes}")
        self.name = name
        self._budget = budget_bytes  # bytes of payload
        self._entries: OrderedDict[StoreKey, Entry] = OrderedDict()  # oldest first
        self._used = 0  # bytes of payload, kept current on put/remove

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[StoreKey]:
        """Returns the keys held, least recently used first."""
        return list(self._entries)

    def contains(self, key: StoreKey) -> bool:
        """Returns whether `key` is held, without touching its LRU position."""
        return key in self._entries

    def get(self, key: StoreKey) -> Entry | None:
        """Returns the entry for `key` and marks it most recently used, or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: StoreKey, entry: Entry) -> list[Evicted]:
        """Stores `entry` as most recently used; returns the entries evicted for room, oldest first.

        Raises:
            EntryTooLargeError: the entry alone is larger than the whole budget.
        """
        if entry.nbytes > self._budget:
            raise EntryTooLargeError(
                f"{key.describe()}: {entry.nbytes} bytes > {self.name} budget of {self._budget} bytes; "
                f"raise the {self.name} budget or keep this module on a slower tier")
        self.remove(key)  # a replaced entry gives its bytes back first
        evicted: list[Evicted] = []
        while self._used + entry.nbytes > self._budget:
            old_key, old_entry = self._entries.popitem(last=False)
            self._used -= old_entry.nbytes
            evicted.append(Evicted(old_key, old_entry))
            log.debug("%s: evicted %s (%d bytes)", self.name, old_key.describe(), old_entry.nbytes)
        self._entries[key] = entry
        self._used += entry.nbytes
        return evicted

    def remove(self, key: StoreKey) -> bool:
        """Forgets `key`; returns whether it was present."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._used -= entry.nbytes
        return True
