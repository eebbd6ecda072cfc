"""DiskStore: atomic checksummed files, LRU by mtime within a budget, bad files become misses."""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import sys

import pytest

from pc_cpu.errors import EntryTooLargeError, StoreError
from pc_cpu.store import disk as disk_module
from pc_cpu.store.base import Evicted, ModuleStore
from pc_cpu.store.disk import DiskStore, default_store_dir
from pc_cpu.store.disk_format import encode_header
from tests.store.conftest import entry, key, name as name_of

PAYLOAD = 1000  # bytes per fake state blob


def file_size(k, e) -> int:
    """Returns the exact size of the file DiskStore writes for (k, e)."""
    return len(encode_header(k, e)) + e.nbytes


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "pc_cpu.store.disk"]


def leftovers(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_is_a_module_store(store_dir):
    assert isinstance(DiskStore(store_dir), ModuleStore)


def test_round_trip_and_byte_totals(store_dir):
    disk = DiskStore(store_dir)
    a, b = entry(PAYLOAD, 1, n_tokens=5), entry(PAYLOAD // 2, 2)
    assert disk.put(key("a"), a) == []
    assert disk.bytes_used == file_size(key("a"), a)
    disk.put(key("b"), b)
    assert disk.bytes_used == file_size(key("a"), a) + file_size(key("b"), b)
    assert disk.get(key("a")) == a  # payload, n_tokens, positions, created all survive
    assert disk.get(key("nope")) is None
    assert disk.contains(key("b")) and not disk.contains(key("nope"))
    assert disk.remove(key("a")) is True
    assert disk.remove(key("a")) is False
    assert disk.bytes_used == file_size(key("b"), b)
    assert not disk.path_for(key("a")).exists()
    assert disk.path_for(key("b")).name == key("b").digest() + ".pcs"
    assert leftovers(store_dir) == []


def test_a_second_process_sees_the_same_entries(store_dir):
    first = DiskStore(store_dir)
    first.put(key("a"), entry(PAYLOAD, 1))
    first.put(key("b"), entry(PAYLOAD, 2))
    second = DiskStore(store_dir)  # scans the directory once at open
    assert second.bytes_used == first.bytes_used
    assert sorted(name_of(k) for k in second.keys()) == ["a", "b"]
    assert second.get(key("b")) == entry(PAYLOAD, 2)
    listing = {item.key.label.split("/")[-1]: item for item in second.ls()}
    assert listing["a"].n_tokens == 7 and listing["a"].positions == (3, 10)
    assert listing["a"].size_bytes == file_size(key("a"), entry(PAYLOAD, 1))
    assert listing["a"].path == first.path_for(key("a"))


def test_replacing_an_entry_keeps_the_total_current(store_dir):
    disk = DiskStore(store_dir)
    disk.put(key("a"), entry(PAYLOAD, 1))
    disk.put(key("a"), entry(PAYLOAD * 2, 2))
    assert disk.bytes_used == file_size(key("a"), entry(PAYLOAD * 2, 2))
    assert disk.get(key("a")).payload == bytes([2]) * PAYLOAD * 2
    assert len(disk) == 1


def test_budget_evicts_least_recently_used_exact_trace(store_dir):
    size = file_size(key("a"), entry(PAYLOAD))  # same-length names: every file has this size
    disk = DiskStore(store_dir, budget_bytes=2 * size + size // 2)
    assert disk.put(key("a"), entry(PAYLOAD)) == []
    assert disk.put(key("b"), entry(PAYLOAD)) == []
    assert disk.get(key("a")) is not None  # touch: b is now the oldest
    assert disk.put(key("c"), entry(PAYLOAD)) == [Evicted(key("b"), None)]
    assert not disk.path_for(key("b")).exists()
    assert [name_of(k) for k in disk.keys()] == ["a", "c"]
    assert disk.bytes_used == 2 * size
    assert disk.put(key("d"), entry(PAYLOAD)) == [Evicted(key("a"), None)]
    assert disk.bytes_used == 2 * size


def test_lru_order_survives_reopening(store_dir):
    size = file_size(key("a"), entry(PAYLOAD))
    first = DiskStore(store_dir, budget_bytes=3 * size)
    for name in "abc":
        first.put(key(name), entry(PAYLOAD))
    # pin mtimes (file clocks are coarse): c oldest, then a, then b
    for name, t in (("c", 100), ("a", 200), ("b", 300)):
        os.utime(first.path_for(key(name)), (t, t))
    second = DiskStore(store_dir, budget_bytes=3 * size)
    assert [name_of(k) for k in second.keys()] == ["c", "a", "b"]
    second.get(key("c"))  # touches the file: c becomes the newest, on disk too
    assert second.path_for(key("c")).stat().st_mtime > 300
    assert second.put(key("d"), entry(PAYLOAD)) == [Evicted(key("a"), None)]
    third = DiskStore(store_dir, budget_bytes=3 * size)
    assert [name_of(k) for k in third.keys()][0] == "b"


def test_entry_larger_than_budget_is_refused(store_dir):
    disk = DiskStore(store_dir, budget_bytes=PAYLOAD)
    with pytest.raises(EntryTooLargeError, match=r"bytes > disk budget of 1000 bytes"):
        disk.put(key("a"), entry(PAYLOAD))
    assert list(store_dir.iterdir()) == []
    assert disk.bytes_used == 0


def test_crash_before_rename_leaves_the_old_entry_and_no_temp_file(store_dir, monkeypatch):
    disk = DiskStore(store_dir)
    disk.put(key("a"), entry(PAYLOAD, 1))
    before = disk.bytes_used

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreError, match="cannot write store file"):
        disk.put(key("a"), entry(PAYLOAD, 2))
    with pytest.raises(StoreError):
        disk.put(key("new"), entry(PAYLOAD, 3))
    monkeypatch.undo()
    assert leftovers(store_dir) == []
    assert disk.bytes_used == before
    assert disk.get(key("a")) == entry(PAYLOAD, 1)
    assert not disk.contains(key("new"))
    assert DiskStore(store_dir).get(key("a")) == entry(PAYLOAD, 1)


def corrupt_flip_payload_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def corrupt_truncate_header(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[:11])


def corrupt_trailing_bytes(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes() + b"extra")


def corrupt_garbage(path: pathlib.Path) -> None:
    path.write_bytes(os.urandom(3000))


def corrupt_empty(path: pathlib.Path) -> None:
    path.write_bytes(b"")


def corrupt_version(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[8] = 99  # the u32 after the 8-byte magic
    path.write_bytes(bytes(data))


def corrupt_header_json(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"n_tokens":7', b'"n_tokens":"x"', 1))


FIXED = 48  # magic 8 + version 4 + meta_len 4 + sha256(meta) 32


def rewrite_meta(path: pathlib.Path, old: bytes, new: bytes) -> None:
    """Edits the JSON header and re-seals it (length and checksum), as a hostile writer would."""
    data = path.read_bytes()
    meta_len = int.from_bytes(data[12:16], "little")
    meta = data[FIXED:FIXED + meta_len].replace(old, new)
    assert meta != data[FIXED:FIXED + meta_len]
    sealed = len(meta).to_bytes(4, "little") + hashlib.sha256(meta).digest()
    path.write_bytes(data[:12] + sealed + meta + data[FIXED + meta_len:])


def corrupt_huge_payload_claim(path: pathlib.Path) -> None:
    rewrite_meta(path, b'"payload_len":1000', b'"payload_len":4611686018427387904')


def corrupt_sealed_header_types(path: pathlib.Path) -> None:
    rewrite_meta(path, b'"n_tokens":7', b'"n_tokens":"x"')


def corrupt_sealed_header_json(path: pathlib.Path) -> None:
    rewrite_meta(path, b'"n_tokens":7', b'"n_tokens":')


CORRUPTIONS = [corrupt_huge_payload_claim, corrupt_sealed_header_types, corrupt_sealed_header_json,
               corrupt_flip_payload_byte, corrupt_truncate, corrupt_truncate_header, corrupt_trailing_bytes,
               corrupt_garbage, corrupt_empty, corrupt_version, corrupt_header_json]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_bad_file_is_a_miss_removed_with_one_warning(store_dir, caplog, corrupt):
    disk = DiskStore(store_dir)
    disk.put(key("a"), entry(PAYLOAD))
    disk.put(key("b"), entry(PAYLOAD))
    path = disk.path_for(key("a"))
    corrupt(path)
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None
    assert not path.exists()
    assert len(warnings_of(caplog)) == 1
    assert "re-encoded" in warnings_of(caplog)[0].getMessage()
    assert disk.bytes_used == file_size(key("b"), entry(PAYLOAD))
    assert disk.get(key("a")) is None  # a plain miss now: no second warning
    assert len(warnings_of(caplog)) == 1
    assert disk.get(key("b")) == entry(PAYLOAD)


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_bad_file_found_by_a_second_process(store_dir, caplog, corrupt):
    DiskStore(store_dir).put(key("a"), entry(PAYLOAD))
    path = DiskStore(store_dir).path_for(key("a"))
    corrupt(path)
    caplog.set_level(logging.WARNING)
    second = DiskStore(store_dir)  # a bad header is caught by the scan at open, a bad payload by get
    assert second.get(key("a")) is None
    assert not path.exists()
    assert len(warnings_of(caplog)) == 1
    assert second.bytes_used == 0


def test_file_of_a_foreign_model_under_our_name_is_a_miss(store_dir, caplog):
    disk = DiskStore(store_dir)
    disk.put(key("a", model="model-B"), entry(PAYLOAD))
    ours = disk.path_for(key("a"))
    os.replace(disk.path_for(key("a", model="model-B")), ours)
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None
    assert not ours.exists()
    assert len(warnings_of(caplog)) == 1
    assert "model-B" in warnings_of(caplog)[0].getMessage()


def test_foreign_model_files_are_simply_other_keys(store_dir):
    disk = DiskStore(store_dir)
    disk.put(key("a", model="model-B"), entry(PAYLOAD))
    assert disk.get(key("a")) is None
    assert disk.contains(key("a", model="model-B"))


def test_scan_ignores_other_files_and_temp_files(store_dir):
    (store_dir / "README.txt").write_text("not an entry")
    (store_dir / ".abc.123.tmp").write_bytes(b"half a write")
    disk = DiskStore(store_dir)
    assert disk.bytes_used == 0 and len(disk) == 0
    assert (store_dir / "README.txt").exists()


def test_every_single_byte_flip_is_caught(store_dir, caplog):
    disk = DiskStore(store_dir)
    disk.put(key("a"), entry(64))
    path = disk.path_for(key("a"))
    good = path.read_bytes()
    caplog.set_level(logging.WARNING)
    for offset in range(len(good)):
        flipped = bytearray(good)
        flipped[offset] ^= 0x01
        path.write_bytes(bytes(flipped))
        assert disk.get(key("a")) is None, f"flip at byte {offset} went unnoticed"
        assert not path.exists()
    assert len(warnings_of(caplog)) == len(good)


def test_verify_reports_bad_files_and_can_delete_them(store_dir):
    disk = DiskStore(store_dir)
    for name in "abc":
        disk.put(key(name), entry(PAYLOAD))
    corrupt_flip_payload_byte(disk.path_for(key("b")))
    corrupt_truncate(disk.path_for(key("c")))
    bad = disk.verify()
    assert sorted((b.path.name, b.reason) for b in bad) == sorted(
        [(disk.path_for(key("b")).name, "checksum"), (disk.path_for(key("c")).name, "truncated")])
    assert disk.path_for(key("b")).exists()  # reporting alone deletes nothing
    assert len(disk.verify(delete=True)) == 2
    assert disk.verify() == []
    assert [name_of(k) for k in disk.keys()] == ["a"]
    assert disk.bytes_used == file_size(key("a"), entry(PAYLOAD))


def test_clear_removes_every_entry(store_dir):
    disk = DiskStore(store_dir)
    for name in "ab":
        disk.put(key(name), entry(PAYLOAD))
    (store_dir / ".x.1.tmp").write_bytes(b"stale")
    assert disk.clear() == 2
    assert list(store_dir.iterdir()) == []
    assert disk.bytes_used == 0 and disk.ls() == []


def test_default_directory(store_dir, tmp_path, monkeypatch):
    assert default_store_dir() == tmp_path / "xdg" / "pc_cpu" / "store"
    assert default_store_dir({"PC_CPU_STORE_DIR": "/x/y", "XDG_CACHE_HOME": "/c"}) == pathlib.Path("/x/y")
    disk = DiskStore()
    assert disk.directory == tmp_path / "xdg" / "pc_cpu" / "store" and disk.directory.is_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    if sys.platform.startswith("linux"):  # platformdirs' rule elsewhere (e.g. ~/Library/Caches on macOS)
        assert default_store_dir({}) == pathlib.Path("~/.cache").expanduser() / "pc_cpu" / "store"


def test_unwritable_directory_is_a_store_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="PC_CPU_STORE_DIR"):
        DiskStore(blocker / "store")


def test_module_logs_and_never_prints(store_dir, capsys):
    disk = DiskStore(store_dir)
    disk.put(key("a"), entry(PAYLOAD))
    corrupt_garbage(disk.path_for(key("a")))
    disk.get(key("a"))
    assert capsys.readouterr() == ("", "")
    assert disk_module.log.name == "pc_cpu.store.disk"


def _old_scheme_file(directory: pathlib.Path, payload: bytes) -> pathlib.Path:
    """Writes a store file as pc_cpu wrote it before content keys: keyed by schema hash and module name."""
    import json
    import struct

    from pc_cpu.store.disk_format import FORMAT_VERSION, MAGIC

    meta = json.dumps({"model": "model-A", "schema_hash": "ab" * 32, "module": "intro", "mode": "preamble",
                       "n_tokens": 7, "pos_start": 3, "pos_end": 10, "created": 1000.0,
                       "payload_len": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()},
                      separators=(",", ":")).encode()
    header = struct.pack("<8sII32s", MAGIC, FORMAT_VERSION, len(meta), hashlib.sha256(meta).digest()) + meta
    old_digest = hashlib.sha256(b'["pc_cpu.store.key/1","model-A","' + b"ab" * 32 + b'","intro","preamble"]')
    path = directory / f"{old_digest.hexdigest()}.pcs"
    path.write_bytes(header + payload)
    return path


def test_a_file_of_the_old_key_scheme_misses_and_is_cleaned_up(store_dir, caplog):
    old = _old_scheme_file(store_dir, b"\x01" * PAYLOAD)
    with caplog.at_level(logging.WARNING):
        disk = DiskStore(store_dir)  # no exception
    assert disk.ls() == [] and not old.exists() and disk.get(key("intro")) is None
    assert any("old_key_scheme" in r.getMessage() for r in warnings_of(caplog))
