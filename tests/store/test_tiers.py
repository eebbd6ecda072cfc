"""TieredStore([ram, disk]): write-through on put, the serving tier, promotion on hit, demotion on eviction."""

from __future__ import annotations

import logging
import os

import pytest

from pc_cpu.errors import StoreError

from pc_cpu.store.disk import DiskStore
from pc_cpu.store.ram import RamStore
from pc_cpu.store.tiers import Hit, TieredStore
from tests.store.conftest import blob_entry, key, name as name_of

P = blob_entry(100).nbytes  # payload bytes of the smallest synthetic entry; every blob_entry(P) has them


@pytest.fixture
def tiers(store_dir):
    """Returns (store, ram, disk): RAM fits two P-byte entries, disk is large."""
    ram, disk = RamStore(2 * P + P // 2), DiskStore(store_dir, budget_bytes=10**6)
    return TieredStore([ram, disk]), ram, disk


@pytest.fixture
def full_disk(monkeypatch, caplog):
    """Makes every disk write fail with ENOSPC until `.undo()`; warnings are captured. Returns the monkeypatch."""

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    caplog.set_level(logging.WARNING)
    return monkeypatch


def modules(store) -> list[str]:
    return [name_of(k) for k in store.keys()]


def test_put_writes_through_to_every_tier(tiers):
    store, ram, disk = tiers
    assert store.put(key("a"), blob_entry(P)) == ("ram", "disk")
    assert modules(ram) == ["a"] and modules(disk) == ["a"]
    assert store.get(key("a")) == Hit(blob_entry(P), "ram")
    assert store.get(key("nope")) is None
    assert store.contains(key("a")) and not store.contains(key("nope"))


def test_ram_keeps_the_most_recent_while_disk_keeps_everything(tiers):
    store, ram, disk = tiers
    store.put(key("a"), blob_entry(P, 1))
    store.put(key("b"), blob_entry(P, 2))
    store.get(key("a"))  # b is now the least recently used
    store.put(key("c"), blob_entry(P, 3))
    assert modules(ram) == ["a", "c"] and modules(disk) == ["a", "b", "c"]
    store.put(key("d"), blob_entry(P, 4))
    assert modules(ram) == ["c", "d"] and modules(disk) == ["a", "b", "c", "d"]
    assert ram.bytes_used == 2 * P and disk.bytes_used > 4 * P
    assert store.get(key("b")) == Hit(blob_entry(P, 2), "disk")


def test_a_ram_eviction_is_demoted_to_a_disk_that_refused_it(tiers, full_disk, caplog):
    store, ram, disk = tiers
    with pytest.raises(StoreError, match="free disk space"):  # the disk was full for a moment: the user hears
        store.put(key("a"), blob_entry(P, 1))
    full_disk.undo()
    assert modules(ram) == ["a"] and modules(disk) == []
    store.put(key("b"), blob_entry(P, 2))
    assert modules(disk) == ["b"]
    store.put(key("c"), blob_entry(P, 3))  # evicts a from RAM: written to disk now, before c
    assert modules(ram) == ["b", "c"] and modules(disk) == ["b", "a", "c"]
    assert store.get(key("a")) == Hit(blob_entry(P, 1), "disk")


def test_disk_hit_is_promoted_and_keeps_its_disk_copy(tiers):
    store, ram, disk = tiers
    for name in "abc":
        store.put(key(name), blob_entry(P))  # a demoted to disk
    assert store.get(key("a")) == Hit(blob_entry(P), "disk")
    assert modules(ram) == ["c", "a"]  # promoted; b evicted from ram, its disk copy stays...
    assert modules(disk) == ["b", "c", "a"]  # ...as does a's (touched by the read)
    assert store.get(key("a")) == Hit(blob_entry(P), "ram")


def test_demotion_skips_what_disk_already_holds(tiers, monkeypatch):
    store, ram, disk = tiers
    for name in "abc":
        store.put(key(name), blob_entry(P))
    writes = []
    real_put = disk.put
    monkeypatch.setattr(disk, "put", lambda k, e: writes.append(name_of(k)) or real_put(k, e))
    store.get(key("a"))  # promoted from disk, evicting b, which is on disk: no write
    store.get(key("b"))  # promoted, evicting c: no write
    store.put(key("d"), blob_entry(P))  # evicts a: no write; d itself is written through
    assert writes == ["d"]
    assert modules(ram) == ["b", "d"]


def test_entry_too_large_for_ram_goes_to_disk(tiers):
    store, ram, disk = tiers
    assert store.put(key("big"), blob_entry(5 * P)) == ("disk",)
    assert modules(ram) == [] and modules(disk) == ["big"]
    assert store.get(key("big")) == Hit(blob_entry(5 * P), "disk")  # too large to promote: still served
    assert modules(ram) == []


def test_entry_too_large_for_every_tier_is_logged_and_not_stored(store_dir, caplog):
    store = TieredStore([RamStore(10), DiskStore(store_dir, budget_bytes=20)])
    caplog.set_level(logging.WARNING)
    assert store.put(key("a"), blob_entry(P)) == ()
    messages = [r.getMessage() for r in caplog.records]
    assert any("not stored in disk" in m and "disk budget of 20 bytes" in m for m in messages)
    assert any("not stored in ram" in m for m in messages)
    assert store.get(key("a")) is None  # a miss: the engine keeps the encoding resident or re-encodes it


def test_remove_forgets_every_tier(tiers):
    store, ram, disk = tiers
    for name in "abc":
        store.put(key(name), blob_entry(P))
    store.get(key("a"))  # a in both tiers
    assert store.remove(key("a")) is True
    assert not ram.contains(key("a")) and not disk.contains(key("a"))
    assert store.remove(key("a")) is False


def test_a_second_process_is_served_from_disk(tiers, store_dir):
    store, _, _ = tiers
    for name in "abc":
        store.put(key(name), blob_entry(P))
    later = TieredStore([RamStore(10 * P), DiskStore(store_dir)])
    assert later.get(key("a")) == Hit(blob_entry(P), "disk")
    assert later.get(key("a")) == Hit(blob_entry(P), "ram")
    assert later.get(key("c")) == Hit(blob_entry(P), "disk")  # still in the first process's RAM: written through


def test_prefetch_loads_a_group_together(tiers):
    store, ram, disk = tiers
    for name in "abcd":
        store.put(key(name), blob_entry(P))  # ram: c, d; disk: a, b
    served = store.prefetch([key("a"), key("b"), key("x")])
    assert served == {key("a"): "disk", key("b"): "disk", key("x"): None}
    assert modules(ram) == ["a", "b"]
    assert modules(disk) == ["c", "d", "a", "b"]  # a and b touched by the read


def test_prefetch_touches_members_already_in_ram_first(tiers):
    store, ram, disk = tiers
    for name in "abc":
        store.put(key(name), blob_entry(P))  # ram: b, c; disk: a
    # without the touch, loading a would evict b (the oldest), a member of the group
    assert store.prefetch([key("b"), key("a")]) == {key("b"): "ram", key("a"): "disk"}
    assert modules(ram) == ["b", "a"]


def test_prefetch_of_a_group_larger_than_ram_warns(tiers, caplog):
    store, ram, disk = tiers
    for name in "abcd":
        store.put(key(name), blob_entry(P))
    caplog.set_level(logging.WARNING)
    served = store.prefetch([key(n) for n in "abcd"])
    assert set(served.values()) == {"ram", "disk"}
    assert any("prefetch: group of 4 modules" in r.getMessage() for r in caplog.records)
    assert ram.bytes_used <= ram.budget_bytes


def test_failed_demotion_is_logged_and_dropped(tiers, full_disk, caplog):
    store, ram, disk = tiers
    for name in "abc":  # every write to the full disk is refused; c's RAM put evicts a, which cannot be demoted
        with pytest.raises(StoreError):
            store.put(key(name), blob_entry(P))
    full_disk.undo()
    assert modules(ram) == ["b", "c"] and modules(disk) == []
    assert any("could not demote" in r.getMessage() for r in caplog.records)
    assert store.get(key("a")) is None  # a miss: the engine re-encodes


def test_tiers_are_an_explicit_ordered_list(store_dir):
    ram, disk = RamStore(P), DiskStore(store_dir)
    assert TieredStore([ram, disk]).tiers == (ram, disk)
    assert TieredStore([ram, disk]).tier("disk") is disk
    with pytest.raises(KeyError, match=r"tiers are \['ram', 'disk'\]"):
        TieredStore([ram, disk]).tier("gpu")
    with pytest.raises(ValueError, match="at least one tier"):
        TieredStore([])
    with pytest.raises(ValueError, match="distinct"):
        TieredStore([ram, RamStore(P)])


def test_three_tiers_cascade(store_dir):
    small, big, disk = RamStore(P), RamStore(2 * P, name="ram2"), DiskStore(store_dir)
    store = TieredStore([small, big, disk])
    for name in "abcd":
        store.put(key(name), blob_entry(P))
    assert modules(small) == ["d"] and modules(big) == ["c", "d"] and modules(disk) == ["a", "b", "c", "d"]
    assert store.get(key("a")) == Hit(blob_entry(P), "disk")  # promoted to the first tier only
    assert modules(small) == ["a"] and modules(big) == ["c", "d"] and modules(disk) == ["b", "c", "d", "a"]


def test_three_tiers_demote_what_a_middle_tier_lacks(store_dir):
    small, big, disk = RamStore(P), RamStore(2 * P, name="ram2"), DiskStore(store_dir)
    store = TieredStore([small, big, disk])
    store.put(key("a"), blob_entry(P))
    big.remove(key("a"))  # as if ram2 had evicted it
    store.put(key("b"), blob_entry(P))  # small evicts a: demoted into ram2, which lacks it
    assert modules(small) == ["b"] and modules(big) == ["a", "b"] and modules(disk) == ["a", "b"]
