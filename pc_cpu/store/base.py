"""The interface every byte tier shares (contains/get/put/remove), and what put hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey


@dataclass(frozen=True)
class Evicted:
    """An entry a tier dropped to stay within its budget.

    ``entry`` is None when the tier did not keep the bytes around (the disk store deletes the
    file without reading it back); the tier manager demotes only evictions that carry an entry.
    """

    key: StoreKey
    entry: Entry | None


class ByteBudget:
    """What every byte tier counts the same way: the bytes it holds (`_used`) against its budget (`_budget`).

    Each tier says what its bytes are (a RAM tier's payloads; a disk tier's files) and keeps
    `_used` current on every put and remove, so reading it costs nothing.
    """

    _used: int
    _budget: int

    @property
    def bytes_used(self) -> int:
        """Returns the bytes this tier holds now."""
        return self._used

    @property
    def budget_bytes(self) -> int:
        """Returns the bytes this tier may hold."""
        return self._budget


@runtime_checkable
class ModuleStore(Protocol):
    """A byte tier of computed cells (modules, documents, turns) with an LRU byte budget.

    ``bytes_used`` is kept current on every put/remove (never recounted). ``name`` is what a
    Result reports as the tier that served a module ("ram", "disk").
    """

    name: str

    @property
    def bytes_used(self) -> int: ...

    @property
    def budget_bytes(self) -> int: ...

    def contains(self, key: StoreKey) -> bool:
        """Returns whether the tier holds `key`, without touching its LRU position."""
        ...

    def get(self, key: StoreKey) -> Entry | None:
        """Returns the entry for `key` and marks it most recently used, or None on a miss."""
        ...

    def put(self, key: StoreKey, entry: Entry) -> list[Evicted]:
        """Stores `entry` (replacing any old one); returns what was evicted, oldest first.

        Raises:
            EntryTooLargeError: the entry alone exceeds the tier's budget.
            StoreError: the tier could not store it (e.g. the disk is not writable).
        """
        ...

    def remove(self, key: StoreKey) -> bool:
        """Forgets `key`; returns whether it was present."""
        ...
