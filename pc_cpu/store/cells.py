"""Checks that a stored entry's cells are the ones its header describes, before anyone restores them.

A store file's checksums prove the bytes are the ones written, not that they make sense: a file
crafted (or written by a buggy pc_cpu) with two cells at one position, or cells outside the
entry's positions, passes them and then breaks its module on every request ("cannot splice").
The disk store reads every entry through `check_cells`, so such a file is a miss (re-encoded)
and `pc-cpu store verify` names it.

What an entry must hold (pc_cpu.engine.prompts.schema_cells and .documents write it so): every KV cache
(section) of its blobs has distinct positions inside [start, end), and the first section, which
attends to the whole context, has one cell per token: `n_tokens` cells. A sliding-window section
may hold fewer (llama.cpp leaves out cells a window behind).
"""

from __future__ import annotations

import numpy as np

from pc_cpu.errors import CorruptEntryError, StateBlobError
from pc_cpu.kvstate import ops, parts
from pc_cpu.store.entry import Entry

REASON = "cells"  # CorruptEntryError.reason of every failure here, as `store verify` lists it


def check_cells(entry: Entry) -> None:
    """Returns if `entry`'s payload holds exactly the cells its n_tokens and positions describe.

    Raises:
        CorruptEntryError: (reason "cells") the payload is not llama.cpp sequence state, or a
            KV cache holds two cells at one position, a cell outside the entry's positions, or
            a cell count other than n_tokens.
    """
    try:
        by_blob = [ops.section_positions(blob) for blob in parts.unpack(entry.payload)]
    except StateBlobError as exc:
        raise CorruptEntryError(f"payload is not llama.cpp sequence state ({exc})", reason=REASON) from None
    for section in range(max(len(sections) for sections in by_blob)):
        positions = np.concatenate([s[section] for s in by_blob if section < len(s)])
        _check_section(positions, section, entry)
    n_cells = sum(len(sections[0]) for sections in by_blob)
    if n_cells != entry.n_tokens:
        raise CorruptEntryError(f"KV cache 0 holds {n_cells} cells, the header says {entry.n_tokens} tokens",
                                reason=REASON)


def _check_section(positions: np.ndarray, section: int, entry: Entry) -> None:
    """Raises CorruptEntryError if `positions` (one KV cache's, all blobs) repeat or leave [start, end)."""
    start, end = entry.positions
    stray = positions[(positions < start) | (positions >= end)]
    if stray.size:
        raise CorruptEntryError(f"KV cache {section} has a cell at position {int(stray[0])}, outside the entry's "
                                f"positions [{start}, {end})", reason=REASON)
    ordered = np.sort(positions)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        raise CorruptEntryError(f"KV cache {section} has two cells at position {int(repeated[0])}; "
                                "a module's cells need distinct positions", reason=REASON)
