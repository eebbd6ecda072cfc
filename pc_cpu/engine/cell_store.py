"""Keeps the cells of one stream in the byte tiers: a blob under its key, checked when it is read back.

Documents (their preambles, encodings and exact prefixes) and conversations store their cells
here: one way to save them, one way to find them, one way to drop an entry that is damaged.
"""

from __future__ import annotations

import logging

from pc_cpu.engine.context import Context
from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import ops, parts
from pc_cpu.result import Tier
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey
from pc_cpu.store.tiers import TieredStore

log = logging.getLogger(__name__)


class CellStore:
    """Saves a stream's cells under a StoreKey and gives them back checked."""

    def __init__(self, prompts: Context, store: TieredStore):
        self.prompts = prompts  # the context whose streams are saved and restored
        self.store = store

    def get(self, key: StoreKey, positions: tuple[int, int]) -> tuple[bytes, Tier] | None:
        """Returns the stored cells of `key` and their tier, or None (a damaged entry is dropped: it misses).

        The cells must be exactly those of `positions` ([start, end)).
        """
        hit = self.store.get(key)
        if hit is None:
            return None
        try:
            (blob,) = parts.unpack(hit.entry.payload)
            info = ops.scan(blob)
            if (info.n_cell, info.pos_min, info.pos_max + 1) != (positions[1] - positions[0], *positions):
                raise StateBlobError(f"it holds {info.n_cell} cells at [{info.pos_min}, {info.pos_max + 1})",
                                     code="corrupt")
        except (StateBlobError, ValueError) as exc:
            self.store.remove(key)
            log.warning("stored %s is unusable (%s); computing it again", key.describe(), exc)
            return None
        return bytes(blob), Tier(hit.tier)  # the byte tier's name: PromptCache names them "ram" and "disk"

    def put(self, key: StoreKey, seq: int, n_tokens: int, positions: tuple[int, int]) -> bytes:
        """Returns the cells of stream `seq` as a one-stream blob, after writing them to the byte tiers under `key`."""
        # Sequence id 0 whichever stream computed it: same tokens, same bytes.
        blob = bytes(ops.with_sequence(ops.restream(self.prompts.state_get(seq), 1), 0))
        self.store.put(key, Entry(parts.pack([blob]), n_tokens, positions))
        return blob

    def restore(self, blob: bytes, seq: int) -> None:
        """Puts a one-stream blob's cells into the empty stream `seq`."""
        self.prompts.seq_rm(seq)
        self.prompts.state_set(seq, ops.restore_blob([blob], self.prompts.n_stream))
