"""StoreKey digests are stable content addresses; Entry validates its metadata."""

from __future__ import annotations

import hashlib

import pytest

from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey, schema_hash
from tests.store.conftest import SCHEMA, key


def test_schema_hash_is_sha256_of_the_source():
    assert schema_hash("<schema/>") == hashlib.sha256(b"<schema/>").hexdigest()


def test_digest_is_pinned():
    # Changing this value orphans every store file users have; bump _DIGEST_TAG on purpose only.
    assert key("intro").digest() == "b3aaa9ce233958e4078bfc99f596fc86812508f43cef844d82f5977969a53204"


def test_every_field_changes_the_digest():
    base = key("intro")
    others = [key("intro2"), key("intro", model="model-B"), key("intro", mode="independent"),
              StoreKey("model-A", schema_hash("other"), "intro", "scaffold")]
    digests = {base.digest(), *(k.digest() for k in others)}
    assert len(digests) == 5
    assert StoreKey("model-A", SCHEMA, "intro", "scaffold") == base  # value semantics
    assert {base: 1}[key("intro")] == 1  # hashable


def test_fields_cannot_run_together():
    assert StoreKey("a", "b", "c", "d").digest() != StoreKey("a", "b", "cd", "").digest()


def test_entry_rejects_bad_positions():
    with pytest.raises(ValueError, match="positions"):
        Entry(b"", n_tokens=1, positions=(5, 4))
    assert Entry(b"xyz", 3, (0, 3)).nbytes == 3
