"""`pc-cpu store ls|verify` on damaged stores, without a model: nothing deleted unless asked, nothing claimed."""

from __future__ import annotations

import os
import pathlib

import pytest

from pc_cpu.store.disk import DiskStore
from pc_cpu.store.document_library import DocumentLibrary
from tests.store.conftest import blob_entry, key
from tests.store.test_disk import damage_three_of_four, files_in, gone_pid, temp_file
from tests.test_cli import run_main


@pytest.fixture
def damaged(tmp_path) -> tuple[pathlib.Path, dict[str, str]]:
    """Returns a store whose a, b and x files are bad (see damage_three_of_four) beside a good d, and their reasons."""
    store = tmp_path / "store"
    return store, damage_three_of_four(DiskStore(store))


def test_ls_and_verify_delete_nothing_and_verify_reports_every_bad_file(damaged, capsys):
    store, expected = damaged
    before = files_in(store)
    code, out, err = run_main(["store", "ls", "--store", str(store), "--json"], capsys)
    assert files_in(store) == before
    assert code == 0 and len(out.splitlines()) == 1 and "3 file(s) not listed" in err
    code, out, err = run_main(["store", "verify", "--store", str(store)], capsys)
    assert code == 1 and files_in(store) == before
    assert {line.split(": ")[1]: line.split(": ")[2] for line in out.splitlines()} == expected
    assert "deleted" not in out and err.strip() == "3 bad file(s)"
    code, out, err = run_main(["store", "verify", "--delete", "--store", str(store)], capsys)
    assert code == 1 and out.count("(deleted)") == 3 and err.strip() == "3 bad file(s), 3 deleted"
    assert files_in(store) == [DiskStore(store).path_for(key("d")).name]
    code, _, err = run_main(["store", "verify", "--store", str(store)], capsys)
    assert code == 0 and err.strip() == "0 bad file(s)"


def test_a_read_only_store_with_a_bad_file_lists_verifies_and_claims_no_deletion(damaged, capsys, monkeypatch):
    store, expected = damaged

    def refuse(self, missing_ok=False):  # a read-only directory (simulated: the tests may run as root)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "unlink", refuse)
    before = files_in(store)
    code, out, _ = run_main(["store", "ls", "--store", str(store)], capsys)
    assert code == 0 and len(out.splitlines()) == 1
    code, out, err = run_main(["store", "verify", "--delete", "--store", str(store)], capsys)
    assert code == 1 and out.count("not deleted: Permission denied") == 3
    assert "(deleted)" not in out and "deleted it" not in err
    assert err.strip() == "3 bad file(s), 0 deleted, 3 could not be deleted"
    assert files_in(store) == before


def test_verify_lists_orphans_in_the_store_and_the_document_library(tmp_path, capsys):
    store = tmp_path / "store"
    DiskStore(store).put(key("a"), blob_entry(1000))
    DocumentLibrary(store / "documents").add("doc-a", "text a", "a")
    orphans = [temp_file(store, "x", pid=gone_pid()), temp_file(store / "documents", "doc-b", pid=gone_pid())]
    temp_file(store, "live", pid=os.getpid())  # a write in progress: not listed, never deleted
    code, out, _ = run_main(["store", "verify", "--store", str(store)], capsys)
    assert code == 1 and [line.split(": ")[1:3] for line in out.splitlines()] == [
        [str(path.relative_to(store)), "orphan"] for path in orphans]
    code, out, _ = run_main(["store", "verify", "--delete", "--store", str(store)], capsys)
    assert code == 1 and out.count("(deleted)") == 2 and not any(path.exists() for path in orphans)
    assert run_main(["store", "verify", "--store", str(store)], capsys)[0] == 0


def test_verify_names_an_entry_whose_cells_contradict_its_header(tmp_path, capsys):
    store = tmp_path / "store"
    disk = DiskStore(store)
    disk.put(key("a"), blob_entry(1000, cells=(3, 4, 5, 5, 7, 8, 9)))  # checksums right, two cells at 5
    code, out, _ = run_main(["store", "verify", "--store", str(store)], capsys)
    assert code == 1 and f"bad: {disk.path_for(key('a')).name}: cells: " in out and "position 5" in out


# --- the same commands on a shared Redis (--remote-store) ----------------------------------------

def test_store_commands_work_on_a_redis_store(redis_url, capsys):
    import json

    from pc_cpu.store.remote import RemoteStore, entry_name
    from tests.store.test_remote import flip_payload_byte

    remote = RemoteStore(redis_url)
    library = DocumentLibrary(shelf=remote.library_shelf())
    library.add("doc-a", "text a", "notes.md")
    doc_key = key("x")
    remote.put(type(doc_key)(doc_key.model, doc_key.content, "document", label="document doc-a"), blob_entry(1000))
    remote.put(key("module"), blob_entry(1000))
    remote.put(key("bad"), blob_entry(1000))
    flip_payload_byte(remote._client, entry_name(key("bad")))
    code, out, err = run_main(["store", "ls", "--remote-store", redis_url, "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["module"] for r in rows] == ["document doc-a", "trip/module", "trip/bad"]
    assert rows[0]["names"] == ["notes.md"]
    code, out, err = run_main(["store", "verify", "--remote-store", redis_url], capsys)
    assert code == 1 and out.startswith(f"bad: {key('bad').digest()}: checksum") and err.strip() == "1 bad entries"
    code, out, err = run_main(["store", "rm", "notes.md", "--remote-store", redis_url], capsys)
    assert code == 0 and "removed document doc-a (notes.md): 1 stored encoding" in out
    code, out, err = run_main(["store", "rm", key("module").digest()[:10], "--remote-store", redis_url], capsys)
    assert code == 0 and out.startswith("removed ")
    assert [k.label for k in remote.keys()] == ["trip/bad"] and len(DocumentLibrary(shelf=remote.library_shelf())) == 0
    code, out, err = run_main(["store", "clear", "--yes", "--remote-store", redis_url], capsys)
    assert code == 0 and out.strip() == "removed 1 entries" and len(remote) == 0


def test_a_redis_that_does_not_answer_is_one_line_naming_it(capsys, monkeypatch):
    from tests.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("PC_CPU_REMOTE_STORE", url)  # the variable stands for the option
    code, out, err = run_main(["store", "ls"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and url in err and "cannot be reached" in err
