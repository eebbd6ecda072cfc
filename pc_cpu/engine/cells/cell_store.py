"""Keeps computed cells in the byte tiers: blobs under a key, checked when they are read back (pc_cpu.store.cells).

Schema modules, documents (their preambles, encodings and exact prefixes) and conversations
store their cells here: one way to save them, one way to find them, one way to drop an entry
that is damaged, and the tier that served each.
"""

from __future__ import annotations

import logging
from typing import Sequence

from pc_cpu.engine.llama.context import Context
from pc_cpu.errors import CorruptEntryError
from pc_cpu.kvstate import ops, parts
from pc_cpu.store.cells import Expected, check_cells
from pc_cpu.result import Tier
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey
from pc_cpu.store.tiers import TieredStore

log = logging.getLogger(__name__)


class CellStore:
    """Saves cells under a StoreKey and gives them back checked, with the tier that served them."""

    def __init__(self, prompts: Context, store: TieredStore):
        self.prompts = prompts  # the context whose streams are saved and restored
        self.store = store

    def get_blobs(self, key: StoreKey, positions: tuple[int, int], n_cells: int | None = None, *,
                  whole_windows: bool = False) -> tuple[list[bytes], Tier] | None:
        """Returns the stored blobs of `key` and their tier, or None (a damaged entry is dropped: it misses).

        Together the blobs must hold `n_cells` cells (default: every position) from exactly
        `positions` ([start, end)); with `whole_windows`, a sliding-window model's blobs must
        hold their window layers' cells too (as schema modules are saved).
        """
        hit = self.store.get(key)
        if hit is None:
            return None
        n_cells = positions[1] - positions[0] if n_cells is None else n_cells
        try:
            blobs = check_cells(hit.entry, Expected(positions, n_cells, whole_windows))
        except CorruptEntryError as exc:
            self.drop(key, str(exc))
            return None
        return blobs, Tier(hit.tier)  # the byte tier's name: PromptCache names them "ram" and "disk"

    def get(self, key: StoreKey, positions: tuple[int, int]) -> tuple[bytes, Tier] | None:
        """Returns the stored one-stream blob of `key`, holding every position of `positions`, and its tier; or None."""
        found = self.get_blobs(key, positions)
        if found is None:
            return None
        blobs, tier = found
        if len(blobs) != 1:
            self.drop(key, f"it holds {len(blobs)} blobs where one was saved")
            return None
        return blobs[0], tier

    def put_blobs(self, key: StoreKey, blobs: Sequence, n_tokens: int, positions: tuple[int, int]) -> None:
        """Writes blobs holding `n_tokens` cells in `positions` through to every byte tier under `key`.

        An entry larger than a tier's budget is skipped there (logged). Any other StoreError (the
        disk is full or refuses the write) is raised: the environment needs fixing, and a store
        that silently keeps nothing would compute everything again in the next process.
        """
        self.store.put(key, Entry(parts.pack(list(blobs)), n_tokens, positions))

    def put(self, key: StoreKey, seq: int, n_tokens: int, positions: tuple[int, int]) -> bytes:
        """Returns the cells of stream `seq` as a one-stream blob, after writing them to the byte tiers under `key`."""
        # Sequence id 0 whichever stream computed it: same tokens, same bytes.
        blob = bytes(ops.with_sequence(ops.restream(self.prompts.state_get(seq), 1), 0))
        self.put_blobs(key, [blob], n_tokens, positions)
        return blob

    def contains(self, key: StoreKey) -> bool:
        """Returns whether a tier holds an entry under `key` (unchecked: `get` checks what it reads)."""
        return self.store.contains(key)

    def remove(self, key: StoreKey) -> None:
        """Removes `key`'s entry from every tier (cells another entry now holds)."""
        self.store.remove(key)

    def drop(self, key: StoreKey, why: str) -> None:
        """Removes a stored entry that cannot serve, saying why it goes."""
        self.store.remove(key)
        log.warning("stored %s is unusable (%s); computing it again", key.describe(), why)

    def restore(self, blob: bytes, seq: int) -> None:
        """Puts a one-stream blob's cells into the empty stream `seq`."""
        self.prompts.seq_rm(seq)
        self.prompts.state_set(seq, ops.restore_blob([blob], self.prompts.n_stream))

