"""DiskStore: atomic checksummed files, LRU by mtime within a budget, bad files become misses."""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from pc_cpu.errors import EntryTooLargeError, StoreError, UnknownEntryError
from pc_cpu.store import disk as disk_module
from pc_cpu.store.atomic import ORPHAN_AGE_S
from pc_cpu.store.base import Evicted, ModuleStore
from pc_cpu.store.disk import DiskStore, default_store_dir
from pc_cpu.store.disk_format import encode_header
from tests.store.conftest import blob_entry, key, name as name_of

PAYLOAD = 1000  # bytes per fake state blob


def file_size(k, e) -> int:
    """Returns the exact size of the file DiskStore writes for (k, e)."""
    return len(encode_header(k, e)) + e.nbytes


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "pc_cpu.store.disk"]


def leftovers(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def files_in(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def temp_file(directory: pathlib.Path, stem: str, *, pid: int | None = None, age_s: float = 0.0,
              nbytes: int = 100) -> pathlib.Path:
    """Writes a temp file named as an atomic write names it (`.<stem>.<pid>.<random>.tmp`; older
    versions left the pid out), last written `age_s` seconds ago."""
    path = directory / (f".{stem}.{pid}.k3x9q2zw.tmp" if pid is not None else f".{stem}.k3x9q2zw.tmp")
    path.write_bytes(b"\0" * nbytes)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def gone_pid() -> int:
    """Returns the pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def refuse_deletes(monkeypatch):
    """Returns a function that makes every later file deletion fail as in a read-only directory.

    Simulated: these tests may run as root, whom chmod does not stop.
    """

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied", str(self))

    return lambda: monkeypatch.setattr(pathlib.Path, "unlink", refuse)


def test_is_a_module_store(store_dir):
    assert isinstance(DiskStore(store_dir), ModuleStore)


def test_round_trip_and_byte_totals(store_dir):
    disk = DiskStore(store_dir)
    a, b = blob_entry(PAYLOAD, 1, n_tokens=5), blob_entry(PAYLOAD // 2, 2)
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
    first.put(key("a"), blob_entry(PAYLOAD, 1))
    first.put(key("b"), blob_entry(PAYLOAD, 2))
    second = DiskStore(store_dir)  # scans the directory once at open
    assert second.bytes_used == first.bytes_used
    assert sorted(name_of(k) for k in second.keys()) == ["a", "b"]
    assert second.get(key("b")) == blob_entry(PAYLOAD, 2)
    listing = {item.key.label.split("/")[-1]: item for item in second.ls()}
    assert listing["a"].n_tokens == 7 and listing["a"].positions == (3, 10)
    assert listing["a"].size_bytes == file_size(key("a"), blob_entry(PAYLOAD, 1))
    assert listing["a"].path == first.path_for(key("a"))


def test_replacing_an_entry_keeps_the_total_current(store_dir):
    disk = DiskStore(store_dir)
    disk.put(key("a"), blob_entry(PAYLOAD, 1))
    disk.put(key("a"), blob_entry(PAYLOAD * 2, 2))
    assert disk.bytes_used == file_size(key("a"), blob_entry(PAYLOAD * 2, 2))
    assert disk.get(key("a")).payload == blob_entry(PAYLOAD * 2, 2).payload
    assert len(disk) == 1


def test_budget_evicts_least_recently_used_exact_trace(store_dir):
    size = file_size(key("a"), blob_entry(PAYLOAD))  # same-length names: every file has this size
    disk = DiskStore(store_dir, budget_bytes=2 * size + size // 2)
    assert disk.put(key("a"), blob_entry(PAYLOAD)) == []
    assert disk.put(key("b"), blob_entry(PAYLOAD)) == []
    assert disk.get(key("a")) is not None  # touch: b is now the oldest
    assert disk.put(key("c"), blob_entry(PAYLOAD)) == [Evicted(key("b"), None)]
    assert not disk.path_for(key("b")).exists()
    assert [name_of(k) for k in disk.keys()] == ["a", "c"]
    assert disk.bytes_used == 2 * size
    assert disk.put(key("d"), blob_entry(PAYLOAD)) == [Evicted(key("a"), None)]
    assert disk.bytes_used == 2 * size


def test_lru_order_survives_reopening(store_dir):
    size = file_size(key("a"), blob_entry(PAYLOAD))
    first = DiskStore(store_dir, budget_bytes=3 * size)
    for name in "abc":
        first.put(key(name), blob_entry(PAYLOAD))
    # pin mtimes (file clocks are coarse): c oldest, then a, then b
    for name, t in (("c", 100), ("a", 200), ("b", 300)):
        os.utime(first.path_for(key(name)), (t, t))
    second = DiskStore(store_dir, budget_bytes=3 * size)
    assert [name_of(k) for k in second.keys()] == ["c", "a", "b"]
    second.get(key("c"))  # touches the file: c becomes the newest, on disk too
    assert second.path_for(key("c")).stat().st_mtime > 300
    assert second.put(key("d"), blob_entry(PAYLOAD)) == [Evicted(key("a"), None)]
    third = DiskStore(store_dir, budget_bytes=3 * size)
    assert [name_of(k) for k in third.keys()][0] == "b"


def test_entry_larger_than_budget_is_refused(store_dir):
    disk = DiskStore(store_dir, budget_bytes=PAYLOAD)
    with pytest.raises(EntryTooLargeError, match=r"bytes > disk budget of 1000 bytes"):
        disk.put(key("a"), blob_entry(PAYLOAD))
    assert list(store_dir.iterdir()) == []
    assert disk.bytes_used == 0


def test_crash_before_rename_leaves_the_old_entry_and_no_temp_file(store_dir, monkeypatch):
    disk = DiskStore(store_dir)
    disk.put(key("a"), blob_entry(PAYLOAD, 1))
    before = disk.bytes_used

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreError, match="cannot write store file"):
        disk.put(key("a"), blob_entry(PAYLOAD, 2))
    with pytest.raises(StoreError):
        disk.put(key("new"), blob_entry(PAYLOAD, 3))
    monkeypatch.undo()
    assert leftovers(store_dir) == []
    assert disk.bytes_used == before
    assert disk.get(key("a")) == blob_entry(PAYLOAD, 1)
    assert not disk.contains(key("new"))
    assert DiskStore(store_dir).get(key("a")) == blob_entry(PAYLOAD, 1)


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
    disk.put(key("a"), blob_entry(PAYLOAD))
    disk.put(key("b"), blob_entry(PAYLOAD))
    path = disk.path_for(key("a"))
    corrupt(path)
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None
    assert not path.exists()
    assert len(warnings_of(caplog)) == 1
    assert "re-encoded" in warnings_of(caplog)[0].getMessage()
    assert disk.bytes_used == file_size(key("b"), blob_entry(PAYLOAD))
    assert disk.get(key("a")) is None  # a plain miss now: no second warning
    assert len(warnings_of(caplog)) == 1
    assert disk.get(key("b")) == blob_entry(PAYLOAD)


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_bad_file_found_by_a_second_process(store_dir, caplog, corrupt):
    DiskStore(store_dir).put(key("a"), blob_entry(PAYLOAD))
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
    disk.put(key("a", model="model-B"), blob_entry(PAYLOAD))
    ours = disk.path_for(key("a"))
    os.replace(disk.path_for(key("a", model="model-B")), ours)
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None
    assert not ours.exists()
    assert len(warnings_of(caplog)) == 1
    assert "model-B" in warnings_of(caplog)[0].getMessage()


def test_foreign_model_files_are_simply_other_keys(store_dir):
    disk = DiskStore(store_dir)
    disk.put(key("a", model="model-B"), blob_entry(PAYLOAD))
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
    disk.put(key("a"), blob_entry(64))
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
        disk.put(key(name), blob_entry(PAYLOAD))
    corrupt_flip_payload_byte(disk.path_for(key("b")))
    corrupt_truncate(disk.path_for(key("c")))
    bad = disk.verify()
    assert sorted((b.path.name, b.reason) for b in bad) == sorted(
        [(disk.path_for(key("b")).name, "checksum"), (disk.path_for(key("c")).name, "truncated")])
    assert disk.path_for(key("b")).exists()  # reporting alone deletes nothing
    assert len(disk.verify(delete=True)) == 2
    assert disk.verify() == []
    assert [name_of(k) for k in disk.keys()] == ["a"]
    assert disk.bytes_used == file_size(key("a"), blob_entry(PAYLOAD))


def test_clear_removes_every_entry_and_orphan_but_not_a_live_write(store_dir):
    disk = DiskStore(store_dir)
    for name in "ab":
        disk.put(key(name), blob_entry(PAYLOAD))
    stale, live = temp_file(store_dir, "x", age_s=2 * ORPHAN_AGE_S), temp_file(store_dir, "y", pid=os.getpid())
    assert disk.clear() == 2
    assert list(store_dir.iterdir()) == [live]
    assert not stale.exists() and disk.bytes_used == 0 and disk.ls() == []


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
    disk.put(key("a"), blob_entry(PAYLOAD))
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


def test_a_file_of_the_old_key_scheme_misses_and_only_verify_deletes_it(store_dir):
    old = _old_scheme_file(store_dir, b"\x01" * PAYLOAD)
    disk = DiskStore(store_dir)  # no exception
    assert disk.ls() == [] and disk.get(key("intro")) is None and old.exists()
    assert [(b.path, b.reason) for b in disk.unusable()] == [(old, "old_key_scheme")]
    assert [(b.path, b.reason, b.deleted) for b in disk.verify(delete=True)] == [(old, "old_key_scheme", True)]
    assert not old.exists()


# --- opening and listing delete nothing; verify reports, and deletes only when asked ---------

def damage_three_of_four(disk: DiskStore) -> dict[str, str]:
    """Breaks a's header, empties b, renames c's valid file to x's name; returns {file name: reason}."""
    for name in "abcd":
        disk.put(key(name), blob_entry(PAYLOAD))
    corrupt_version(disk.path_for(key("a")))
    corrupt_empty(disk.path_for(key("b")))
    os.replace(disk.path_for(key("c")), disk.path_for(key("x")))  # a valid entry under another entry's name
    return {disk.path_for(key("a")).name: "version", disk.path_for(key("b")).name: "truncated",
            disk.path_for(key("x")).name: "foreign_key"}


def test_opening_and_listing_delete_nothing(store_dir, caplog):
    expected = damage_three_of_four(DiskStore(store_dir))
    before = files_in(store_dir)
    caplog.set_level(logging.WARNING)
    disk = DiskStore(store_dir)
    assert [name_of(item.key) for item in disk.ls()] == ["d"]
    assert files_in(store_dir) == before
    assert warnings_of(caplog) == []  # nothing was deleted, so nothing claims it was
    assert {bad.path.name: bad.reason for bad in disk.unusable()} == expected


def test_verify_reports_every_bad_file_and_deletes_only_when_asked(store_dir):
    expected = damage_three_of_four(DiskStore(store_dir))
    before = files_in(store_dir)
    disk = DiskStore(store_dir)
    assert {(bad.path.name, bad.reason, bad.deleted) for bad in disk.verify()} == {
        (name, reason, False) for name, reason in expected.items()}
    assert files_in(store_dir) == before
    assert {(bad.path.name, bad.deleted) for bad in disk.verify(delete=True)} == {(n, True) for n in expected}
    assert files_in(store_dir) == [disk.path_for(key("d")).name]
    assert disk.verify() == []


def test_a_read_only_store_with_a_bad_file_still_opens_lists_and_verifies(store_dir, refuse_deletes, caplog):
    disk = DiskStore(store_dir)
    disk.put(key("a"), blob_entry(PAYLOAD))
    disk.put(key("b"), blob_entry(PAYLOAD))
    corrupt_version(disk.path_for(key("a")))
    refuse_deletes()
    caplog.set_level(logging.WARNING)
    reopened = DiskStore(store_dir)
    assert [name_of(item.key) for item in reopened.ls()] == ["b"]
    (bad,) = reopened.verify(delete=True)
    assert (bad.reason, bad.deleted) == ("version", False) and "not deleted: Permission denied" in bad.message
    assert disk.path_for(key("a")).exists()
    assert not any("deleted it" in r.getMessage() for r in warnings_of(caplog))


def test_get_of_a_bad_file_it_cannot_delete_warns_once_and_says_so(store_dir, refuse_deletes, caplog):
    disk = DiskStore(store_dir)
    disk.put(key("a"), blob_entry(PAYLOAD))
    corrupt_flip_payload_byte(disk.path_for(key("a")))
    refuse_deletes()
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None and disk.get(key("a")) is None
    (warning,) = warnings_of(caplog)
    assert "could not delete it (Permission denied)" in warning.getMessage()
    assert "deleted it" not in warning.getMessage().replace("could not delete it", "")
    assert disk.path_for(key("a")).exists() and disk.bytes_used == 0


# --- orphaned temp files: listed, counted, and deleted only when their writer is gone ---------

def test_a_write_killed_mid_way_leaves_an_orphan_that_verify_lists_and_deletes(store_dir):
    writer = textwrap.dedent("""
        import os, sys
        from pc_cpu.store.disk import DiskStore
        from tests.store.conftest import blob_entry, key
        # A hung disk: fsync returns when the test closes stdin (or dies), not after some time a slow machine outlasts.
        os.fsync = lambda fd: (print("writing", flush=True), sys.stdin.read())
        DiskStore(sys.argv[1]).put(key("a"), blob_entry(1000))
    """)
    root = pathlib.Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", writer, str(store_dir)], cwd=root, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"writing"
        (temp,) = [p for p in store_dir.iterdir() if p.name.endswith(".tmp")]
        assert DiskStore(store_dir).verify(delete=True) == []  # its writer is alive: a write in progress
    finally:
        child.kill()  # kill -9
        child.wait()
        child.stdin.close()
        child.stdout.close()
    disk = DiskStore(store_dir)
    assert disk.bytes_used == temp.stat().st_size  # counted against the budget from the open on
    (bad,) = disk.verify()
    assert (bad.path, bad.reason) == (temp, "orphan") and f"process {child.pid}, is gone" in bad.message
    assert temp.exists()
    assert [bad.deleted for bad in disk.verify(delete=True)] == [True]
    assert not temp.exists() and disk.bytes_used == 0


def test_orphans_are_told_from_live_writes(store_dir):
    orphans = {temp_file(store_dir, "dead", pid=gone_pid()).name,
               temp_file(store_dir, "old", pid=os.getpid(), age_s=2 * ORPHAN_AGE_S).name,  # pids are reused
               temp_file(store_dir, "oldunnamed", age_s=2 * ORPHAN_AGE_S).name}
    temp_file(store_dir, "live", pid=os.getpid())
    temp_file(store_dir, "freshunnamed")  # no pid to ask, and young: may be a write in progress
    assert {bad.path.name for bad in DiskStore(store_dir).verify()} == orphans


def test_a_store_checked_writable_deletes_what_killed_writers_left_and_nothing_else(store_dir):
    DiskStore(store_dir).put(key("a"), blob_entry(PAYLOAD))
    orphan = temp_file(store_dir, "x", pid=gone_pid())
    live = temp_file(store_dir, "live", pid=os.getpid())  # a write in progress
    assert [bad.path for bad in DiskStore(store_dir).verify()] == [orphan]  # opening deletes nothing
    disk = DiskStore(store_dir)
    disk.check_writable()  # as a cache opening the store, after a crash: it will write, so it cleans up
    assert not orphan.exists() and live.exists()
    assert disk.verify() == [] and DiskStore(store_dir).verify() == []
    assert [name_of(k) for k in disk.keys()] == ["a"] and disk.bytes_used == file_size(key("a"), blob_entry(PAYLOAD))


def test_orphans_count_against_the_budget_and_go_before_any_entry(store_dir):
    size = file_size(key("a"), blob_entry(PAYLOAD))
    orphan = temp_file(store_dir, "x", pid=gone_pid(), nbytes=size)
    disk = DiskStore(store_dir, budget_bytes=2 * size)
    assert disk.bytes_used == size and orphan.exists()  # opening counts it, deletes nothing
    assert disk.put(key("a"), blob_entry(PAYLOAD)) == []  # fits beside the orphan
    assert disk.put(key("b"), blob_entry(PAYLOAD)) == []  # needs the orphan's room: it goes, no entry does
    assert not orphan.exists() and disk.bytes_used == 2 * size
    assert [name_of(k) for k in disk.keys()] == ["a", "b"]


# --- entries whose checksums are right but whose cells are not what the header says -------------

CRAFTED = [
    pytest.param(dict(cells=(3, 4, 5, 5, 7, 8, 9)), "two cells at position 5", id="duplicate position"),
    pytest.param(dict(cells=(3, 4, 5, 6, 7, 8, 10)), "position 10, outside the entry's positions [3, 10)",
                 id="position past the end"),
    pytest.param(dict(cells=(2, 3, 4, 5, 6, 7, 8)), "position 2, outside", id="position before the start"),
    pytest.param(dict(cells=(3, 4, 5, 6, 7, 8)), "holds 6 cells, the header says 7 tokens", id="too few cells"),
]


@pytest.mark.parametrize("craft, why", CRAFTED)
def test_an_entry_with_impossible_cells_is_a_miss_and_verify_names_it(store_dir, caplog, craft, why):
    disk = DiskStore(store_dir)
    disk.put(key("a"), blob_entry(PAYLOAD, **craft))  # sealed by the writer: every checksum is right
    disk.put(key("b"), blob_entry(PAYLOAD))
    (bad,) = DiskStore(store_dir).verify()
    assert (bad.path, bad.reason) == (disk.path_for(key("a")), "cells") and why in bad.message
    caplog.set_level(logging.WARNING)
    assert disk.get(key("a")) is None  # a miss: the engine encodes it again
    (warning,) = warnings_of(caplog)
    assert why in warning.getMessage() and "re-encoded" in warning.getMessage()
    assert not disk.path_for(key("a")).exists()
    assert disk.get(key("b")) == blob_entry(PAYLOAD)


def test_entry_with_id_finds_one_entry_by_a_prefix_of_its_id_and_names_what_went_wrong(store_dir):
    disk = DiskStore(store_dir)
    keys = [key(f"m{i}") for i in range(40)]  # enough that two ids share a first hex digit
    for k in keys:
        disk.put(k, blob_entry(PAYLOAD // 4))
    ids = {k: k.digest() for k in keys}
    first = keys[0]
    assert disk.entry_with_id(ids[first][:16]).key == first
    shared = next(d[:1] for d in ids.values() if sum(o.startswith(d[:1]) for o in ids.values()) > 1)
    n = sum(d.startswith(shared) for d in ids.values())
    with pytest.raises(UnknownEntryError, match=f"matches {n} stored modules; give a longer prefix") as ambiguous:
        disk.entry_with_id(shared)
    assert ambiguous.value.matches == n
    with pytest.raises(UnknownEntryError, match="no stored module has id 'zz'") as missing:
        disk.entry_with_id("zz")
    assert missing.value.matches == 0
    with pytest.raises(UnknownEntryError) as empty:
        disk.entry_with_id("")  # an empty prefix names no entry, not every entry
    assert empty.value.matches == 0


def _sha256_file(disk: DiskStore, k, entry) -> pathlib.Path:
    """Writes `entry` under `k` as pc_cpu wrote files before 2026-12-05: the payload's checksum a sha256."""
    import json
    import struct

    from pc_cpu.store.disk_format import FORMAT_VERSION, MAGIC

    meta = json.dumps({"model": k.model, "content": k.content, "mode": k.mode, "label": k.label,
                       "n_tokens": entry.n_tokens, "pos_start": entry.positions[0], "pos_end": entry.positions[1],
                       "created": entry.created, "payload_len": entry.nbytes,
                       "payload_sha256": hashlib.sha256(entry.payload).hexdigest()}, separators=(",", ":")).encode()
    path = disk.path_for(k)
    path.write_bytes(struct.pack("<8sII32s", MAGIC, FORMAT_VERSION, len(meta), hashlib.sha256(meta).digest())
                     + meta + entry.payload)
    return path


def test_files_with_a_sha256_payload_checksum_still_read_and_still_catch_a_flip(store_dir):
    entry = blob_entry(PAYLOAD)
    path = _sha256_file(DiskStore(store_dir), key("a"), entry)
    disk = DiskStore(store_dir)
    assert disk.get(key("a")).payload == entry.payload and disk.verify() == []
    disk.put(key("b"), entry)
    assert b'"payload_xxh3_128":' in disk.path_for(key("b")).read_bytes()  # what is written now
    corrupt_flip_payload_byte(path)
    assert [(b.path, b.reason) for b in disk.verify()] == [(path, "checksum")]
