"""Checks that a stored entry's cells are the ones its header describes, before anyone restores them.

A store file's checksums prove the bytes are the ones written, not that they make sense: a file
crafted (or written by a buggy pc_cpu) with two cells at one position, or cells outside the
entry's positions, passes them and then breaks its module on every request ("cannot splice").
This is the one check of cells read from a tier: the disk store runs it on every entry it reads
(so such a file is a miss, re-encoded, and `pc-cpu store verify` names it), and the engine's
CellStore runs it on every entry it restores, whichever tier served it, with what the caller
expects of it (`expect`).

What an entry must hold (pc_cpu.engine.prompts.schema_cells and .documents write it so): every KV cache
(section) of its blobs has distinct positions inside [start, end), and the first section, which
attends to the whole context, has one cell per token: `n_tokens` cells. A sliding-window section
may hold fewer (llama.cpp leaves out cells a window behind).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pc_cpu.errors import CorruptEntryError, StateBlobError
from pc_cpu.kvstate import ops, parts
from pc_cpu.store.entry import Entry

REASON = "cells"  # CorruptEntryError.reason of every failure here, as `store verify` lists it


@dataclass(frozen=True)
class Expected:
    """What a reader needs of an entry's cells, beyond its header: `n_cells` spanning exactly `positions`."""

    positions: tuple[int, int]  # [start, end) of the cells, lowest to highest position
    n_cells: int  # cells of the first KV cache, every blob together
    whole_windows: bool = False  # a sliding-window model's blobs must hold their window layers' cells too


def check_cells(entry: Entry, expect: Expected | None = None) -> list[bytes]:
    """Returns `entry`'s blobs once its payload holds exactly the cells its header (and `expect`) describe.

    Raises:
        CorruptEntryError: (reason "cells") the payload is not llama.cpp sequence state, or a
            KV cache holds two cells at one position, a cell outside the entry's positions, a
            cell count other than n_tokens, or cells other than `expect` needs.
    """
    try:
        blobs = [bytes(blob) for blob in parts.unpack(entry.payload)]
        by_blob = [ops.section_positions(blob) for blob in blobs]
        if not blobs:
            raise StateBlobError("it holds no blob", code="corrupt")
    except (StateBlobError, ValueError) as exc:
        raise CorruptEntryError(f"payload is not llama.cpp sequence state ({exc})", reason=REASON) from None
    for section in range(max(len(sections) for sections in by_blob)):
        positions = np.concatenate([s[section] for s in by_blob if section < len(s)])
        _check_section(positions, section, entry)
    n_cells = sum(len(sections[0]) for sections in by_blob)
    if n_cells != entry.n_tokens:
        raise CorruptEntryError(f"KV cache 0 holds {n_cells} cells, the header says {entry.n_tokens} tokens",
                                reason=REASON)
    if expect is not None:
        _check_expected(by_blob, expect)
    return blobs


def _check_expected(by_blob: list, expect: Expected) -> None:
    """Raises CorruptEntryError unless the blobs' cells are the `expect`ed count, spanning exactly its positions."""
    first = np.concatenate([sections[0] for sections in by_blob])
    found = (len(first), int(first.min()) if first.size else 0, int(first.max()) + 1 if first.size else 0)
    if found != (expect.n_cells, *expect.positions):
        raise CorruptEntryError(f"it holds {found[0]} cells at [{found[1]}, {found[2]}), where {expect.n_cells} at "
                                f"[{expect.positions[0]}, {expect.positions[1]}) are needed", reason=REASON)
    if expect.whole_windows:
        for sections in by_blob:
            if len(sections) > 1 and len({len(s) for s in sections}) > 1:
                raise CorruptEntryError("it lacks sliding-window cells (saved whole by an older pc_cpu)",
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
