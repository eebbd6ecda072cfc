"""Computed cells as the store keeps them (a module's, a document's, a turn's): the opaque state blobs plus their metadata."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    """One entry of computed cells: llama_state_seq_get_data output plus what the engine needs to reuse it.

    The payload is opaque to the store; only its length counts against budgets.
    """

    payload: bytes  # llama_state_seq_get_data output
    n_tokens: int  # tokens encoded in the payload
    positions: tuple[int, int]  # positions [start, end) the cells occupy
    created: float = field(default_factory=time.time)  # unix seconds when encoded

    def __post_init__(self) -> None:
        start, end = self.positions
        if self.n_tokens < 0 or not 0 <= start <= end:
            raise ValueError(f"entry: bad n_tokens={self.n_tokens} or positions [{start}, {end})")

    @property
    def nbytes(self) -> int:
        """Returns the payload size in bytes (what a RAM budget counts)."""
        return len(self.payload)
