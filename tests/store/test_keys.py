"""StoreKey digests are stable content addresses; Entry validates its metadata."""

from __future__ import annotations

import hashlib

import pytest

from pc_cpu.pml.encoding import content_digest
from pc_cpu.store.entry import Entry
from pc_cpu.store.keys import StoreKey, schema_hash
from tests.store.conftest import key


def test_schema_hash_is_sha256_of_the_source():
    assert schema_hash("<schema/>") == hashlib.sha256(b"<schema/>").hexdigest()


def test_digest_is_pinned():
    # Changing this value orphans every store file users have; bump _DIGEST_TAG on purpose only.
    assert StoreKey("model-A", "c" * 64, "preamble").digest() == (
        hashlib.sha256(b'["pc_cpu.store.key/2","model-A","' + b"c" * 64 + b'","preamble"]').hexdigest())


def test_every_field_but_the_label_changes_the_digest():
    base = key("intro")
    others = [key("intro2"), key("intro", model="model-B"), key("intro", mode="independent")]
    assert len({base.digest(), *(k.digest() for k in others)}) == 4
    relabelled = StoreKey(base.model, base.content, base.mode, label="another schema/another name")
    assert relabelled == base and relabelled.digest() == base.digest()  # names are not content
    assert {base: 1}[relabelled] == 1  # hashable, by content


def test_fields_cannot_run_together():
    assert StoreKey("a", "b", "cd").digest() != StoreKey("a", "bc", "d").digest()
    assert content_digest([1, 2], [3]) != content_digest([1], [2, 3])


def test_entry_rejects_bad_positions():
    with pytest.raises(ValueError, match="positions"):
        Entry(b"", n_tokens=1, positions=(5, 4))
    assert Entry(b"xyz", 3, (0, 3)).nbytes == 3
