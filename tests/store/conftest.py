"""Factories for the byte-tier tests: keys and entries with fake payloads (no model)."""

from __future__ import annotations

import pytest

from pc_cpu.store.entry import Entry
from pc_cpu.pml.encoding import content_digest
from pc_cpu.store.keys import StoreKey


def key(module: str, *, model: str = "model-A", mode: str = "preamble") -> StoreKey:
    """Returns a StoreKey whose content stands for module `module` of a test schema (labelled with its name)."""
    return StoreKey(model=model, content=content_digest("test", module), mode=mode, label=f"trip/{module}")


def name(store_key: StoreKey) -> str:
    """Returns the module name a `key(...)` was made for (read back from its label)."""
    return store_key.label.split("/")[-1]


def entry(nbytes: int, fill: int = 0xAB, *, n_tokens: int = 7, created: float = 1000.0) -> Entry:
    """Returns an Entry whose payload is `nbytes` copies of `fill` (a fake state blob)."""
    return Entry(payload=bytes([fill]) * nbytes, n_tokens=n_tokens, positions=(3, 3 + n_tokens), created=created)


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """Returns an empty directory for a DiskStore; user cache paths point into tmp_path too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PC_CPU_STORE_DIR", raising=False)
    directory = tmp_path / "store"
    directory.mkdir()
    return directory
