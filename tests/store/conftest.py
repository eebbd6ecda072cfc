"""Factories for the byte-tier tests: keys, and entries with fake or synthetic state payloads (no model)."""

from __future__ import annotations

import pytest

from pc_cpu.store.entry import Entry
from pc_cpu.pml.encoding import content_digest
from pc_cpu.store.keys import StoreKey
from tests.native.conftest import BlobSpec, make_blob


def key(module: str, *, model: str = "model-A", mode: str = "preamble") -> StoreKey:
    """Returns a StoreKey whose content stands for module `module` of a test schema (labelled with its name)."""
    return StoreKey(model=model, content=content_digest("test", module), mode=mode, label=f"trip/{module}")


def name(store_key: StoreKey) -> str:
    """Returns the module name a `key(...)` was made for (read back from its label)."""
    return store_key.label.split("/")[-1]


def entry(nbytes: int, fill: int = 0xAB, *, n_tokens: int = 7, created: float = 1000.0) -> Entry:
    """Returns an Entry whose payload is `nbytes` copies of `fill` (a fake state blob)."""
    return Entry(payload=bytes([fill]) * nbytes, n_tokens=n_tokens, positions=(3, 3 + n_tokens), created=created)


def blob_entry(nbytes: int, fill: int = 0xAB, *, n_tokens: int = 7, created: float = 1000.0,
               cells: tuple[int, ...] | None = None) -> Entry:
    """Returns an Entry at positions [3, 3 + n_tokens) whose payload is a valid state blob of about `nbytes` bytes.

    What the disk store reads back must hold real cells (pc_cpu.store.cells); RAM never looks.
    Args:
        nbytes: the least payload size; one layer of F16 K and V is widened to reach it.
        fill: the seed of the K and V values, so different fills give different payloads.
        cells: the cells' positions (default: one per token, 3, 4, ...), to craft bad entries.
    """
    cells = tuple(range(3, 3 + n_tokens)) if cells is None else cells
    fixed = 48 + 12 * len(cells)  # headers, cells, two layer headers: the bytes that do not grow with head_dim
    head_dim = max(1, -(-(nbytes - fixed) // (4 * max(1, len(cells)))))  # K and V: 2 bytes each per cell and dim
    payload = make_blob(BlobSpec(positions=cells, n_layer=1, n_head_kv=1, head_dim=head_dim, seed=fill))
    return Entry(payload=payload, n_tokens=n_tokens, positions=(3, 3 + n_tokens), created=created)


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """Returns an empty directory for a DiskStore; user cache paths point into tmp_path too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PC_CPU_STORE_DIR", raising=False)
    directory = tmp_path / "store"
    directory.mkdir()
    return directory
