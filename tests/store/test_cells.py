"""store.cells.check_cells: the one check of cells read from a tier, against their header and what the reader needs."""

from __future__ import annotations

import pytest

from pc_cpu.errors import CorruptEntryError
from pc_cpu.kvstate import parts
from pc_cpu.store.cells import Expected, check_cells
from tests.store.conftest import blob_entry


def test_an_entry_holding_what_the_reader_needs_gives_back_its_blobs():
    entry = blob_entry(256, n_tokens=7)
    assert check_cells(entry, Expected((3, 10), 7)) == [bytes(b) for b in parts.unpack(entry.payload)]


@pytest.mark.parametrize("expect, fragment", [
    (Expected((0, 7), 7), "at [3, 10), where 7 at [0, 7) are needed"),  # other positions than the reader's
    (Expected((3, 10), 6), "it holds 7 cells at [3, 10), where 6"),  # another count
])
def test_an_entry_the_reader_cannot_use_is_refused_naming_what_it_holds(expect, fragment):
    with pytest.raises(CorruptEntryError) as refused:
        check_cells(blob_entry(256, n_tokens=7), expect)
    assert fragment in str(refused.value)


def test_without_expectations_only_the_header_is_checked():
    assert len(check_cells(blob_entry(256, n_tokens=7))) == 1
