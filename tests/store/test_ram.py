"""RamStore: LRU order, byte totals after each put/remove, refusal of oversize entries."""

from __future__ import annotations

import pytest

from pc_cpu.errors import EntryTooLargeError, StoreError
from pc_cpu.store.base import Evicted, ModuleStore
from pc_cpu.store.ram import RamStore
from tests.store.conftest import entry, key


def test_is_a_module_store():
    assert isinstance(RamStore(10), ModuleStore)


def test_put_get_and_byte_totals():
    ram = RamStore(100)
    assert ram.put(key("a"), entry(30)) == []
    assert ram.bytes_used == 30
    assert ram.put(key("b"), entry(50)) == []
    assert ram.bytes_used == 80
    assert ram.get(key("a")) == entry(30)
    assert ram.get(key("zzz")) is None
    assert ram.remove(key("a")) is True
    assert ram.bytes_used == 50
    assert ram.remove(key("a")) is False
    assert ram.bytes_used == 50
    assert ram.budget_bytes == 100


def test_evicts_least_recently_used_exact_trace():
    ram = RamStore(100)
    ram.put(key("a"), entry(40, 1))
    ram.put(key("b"), entry(40, 2))
    ram.get(key("a"))  # a is now more recent than b
    evicted = ram.put(key("c"), entry(40, 3))
    assert evicted == [Evicted(key("b"), entry(40, 2))]
    assert ram.keys() == [key("a"), key("c")]
    assert ram.bytes_used == 80
    # one put can evict several, oldest first
    evicted = ram.put(key("d"), entry(90, 4))
    assert [e.key for e in evicted] == [key("a"), key("c")]
    assert ram.keys() == [key("d")]
    assert ram.bytes_used == 90


def test_contains_does_not_touch_lru():
    ram = RamStore(80)
    ram.put(key("a"), entry(40))
    ram.put(key("b"), entry(40))
    assert ram.contains(key("a"))
    assert [e.key for e in ram.put(key("c"), entry(40))] == [key("a")]


def test_replacing_a_key_gives_its_bytes_back_first():
    ram = RamStore(100)
    ram.put(key("a"), entry(60))
    ram.put(key("b"), entry(30))
    assert ram.put(key("a"), entry(70, 9)) == []  # 70 + 30 fits once the old 60 is gone
    assert ram.bytes_used == 100
    assert ram.keys() == [key("b"), key("a")]
    assert ram.get(key("a")).payload == bytes([9]) * 70


def test_entry_filling_the_budget_evicts_everything_else():
    ram = RamStore(100)
    ram.put(key("a"), entry(10))
    ram.put(key("b"), entry(10))
    assert [e.key for e in ram.put(key("c"), entry(100))] == [key("a"), key("b")]
    assert ram.bytes_used == 100


def test_entry_larger_than_budget_is_refused_and_nothing_changes():
    ram = RamStore(100)
    ram.put(key("a"), entry(60))
    with pytest.raises(EntryTooLargeError, match=r"101 bytes > ram budget of 100 bytes") as info:
        ram.put(key("big"), entry(101))
    assert isinstance(info.value, StoreError)
    assert ram.keys() == [key("a")]
    assert ram.bytes_used == 60


def test_negative_budget_is_rejected():
    with pytest.raises(ValueError, match="budget"):
        RamStore(-1)
