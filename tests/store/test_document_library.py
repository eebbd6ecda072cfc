"""DocumentLibrary shared by processes: no lost names, a name never names two texts, orphans verified."""

from __future__ import annotations

import multiprocessing
import os
import re
import time

import pytest

from pc_cpu.errors import DocumentError, PromptCacheError
from pc_cpu.store import file_lock
from pc_cpu.store.atomic import ORPHAN_AGE_S
from pc_cpu.store.document_library import MAX_NAMES_PER_DOCUMENT, DocumentLibrary
from tests.store.test_disk import gone_pid

ROUNDS = MAX_NAMES_PER_DOCUMENT  # a text that wins every round of _claim_names then has every name it may have
CONTEXT = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def _name_one_text(directory, worker: int, barrier, results) -> None:
    """One process: gives the shared text ROUNDS/2 names of its own, from a view opened before anyone wrote."""
    library = DocumentLibrary(directory)
    barrier.wait()
    for i in range(ROUNDS // 2):  # two processes: ROUNDS names, as many as a document takes
        library.add("doc-shared", "the shared text", f"w{worker}-{i}")
    results.put(worker)


def _claim_names(directory, worker: int, barrier, results) -> None:
    """One process: gives its own text each name notes-<round>, at the same moment as the other process."""
    library = DocumentLibrary(directory)
    for i in range(ROUNDS):
        barrier.wait()
        try:
            library.add(f"doc-w{worker}", f"the text of worker {worker}", f"notes-{i}")
            results.put((i, worker, "won"))
        except DocumentError as exc:
            results.put((i, worker, str(exc)))


def run_two(target, directory) -> list:
    """Runs target(directory, worker, barrier, results) in two processes at once; returns what they put."""
    barrier, results = CONTEXT.Barrier(2), CONTEXT.Queue()
    workers = [CONTEXT.Process(target=target, args=(directory, w, barrier, results)) for w in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0, f"worker exited with {worker.exitcode}"
    found = []
    while not results.empty():
        found.append(results.get())
    return found


def test_names_given_to_one_text_at_once_by_two_processes_all_survive(tmp_path):
    assert sorted(run_two(_name_one_text, tmp_path)) == [0, 1]
    names = DocumentLibrary(tmp_path).resolve("doc-shared").names
    assert sorted(names) == sorted(f"w{w}-{i}" for w in (0, 1) for i in range(ROUNDS // 2))


def test_a_name_claimed_by_two_processes_for_different_texts_goes_to_one(tmp_path):
    outcomes = run_two(_claim_names, tmp_path)
    library = DocumentLibrary(tmp_path)
    for i in range(ROUNDS):
        (winner,) = [w for r, w, what in outcomes if r == i and what == "won"]
        (lost,) = [what for r, w, what in outcomes if r == i and what != "won"]
        assert f"name 'notes-{i}' already names document doc-w{winner} with other text" in lost
        assert library.resolve(f"notes-{i}").id == f"doc-w{winner}"
        assert sum(f"notes-{i}" in doc.names for doc in library.all()) == 1


def test_a_stale_view_checks_and_resolves_against_the_files(tmp_path):
    first, second, third = (DocumentLibrary(tmp_path) for _ in range(3))  # as processes opened at once
    second.add("doc-b", "text b", "notes")
    with pytest.raises(DocumentError, match="'notes' already names document doc-b with other text"):
        first.add("doc-a", "text a", "notes")  # its view never saw doc-b
    assert third.resolve("notes").id == "doc-b"  # added since `third` read the library
    second.remove("doc-b")
    first.add("doc-a", "text a", "notes")  # the name is free again
    assert DocumentLibrary(tmp_path).resolve("notes").id == "doc-a"


def test_without_fcntl_the_library_still_works(tmp_path, monkeypatch):
    monkeypatch.setattr(file_lock, "fcntl", None)
    library = DocumentLibrary(tmp_path)
    library.add("doc-a", "text a", "a")
    library.add("doc-a", "text a", "b")
    assert DocumentLibrary(tmp_path).resolve("b").names == ["a", "b"]


def test_verify_lists_orphans_and_unreadable_files_and_deletes_only_when_asked(tmp_path):
    library = DocumentLibrary(tmp_path)
    library.add("doc-a", "text a", "a")
    broken = tmp_path / "doc-b.json"
    broken.write_text("{not json")
    old = tmp_path / "tmpk3x9q2zw.tmp"  # how an older pc_cpu named its temp files: no pid, so age tells
    old.write_text("{}")
    os.utime(old, (time.time() - 2 * ORPHAN_AGE_S,) * 2)
    live = tmp_path / f".doc-c.{os.getpid()}.k3x9q2zw.tmp"  # this process is writing it
    live.write_text("{}")
    assert {(bad.path, bad.reason, bad.deleted) for bad in library.verify()} == {
        (broken, "corrupt", False), (old, "orphan", False)}
    assert broken.exists() and old.exists()
    assert {(bad.path, bad.deleted) for bad in library.verify(delete=True)} == {(broken, True), (old, True)}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".lock", live.name, "doc-a.json"])


def test_delete_orphans_deletes_what_killed_writers_left_and_nothing_else(tmp_path):
    library = DocumentLibrary(tmp_path)
    library.add("doc-a", "text a", "a")
    orphan = tmp_path / f".doc-b.{gone_pid()}.k3x9q2zw.tmp"  # a process killed while writing doc-b's file
    orphan.write_text('{"id": "doc-b", "te')
    live = tmp_path / f".doc-c.{os.getpid()}.k3x9q2zw.tmp"  # this process is writing it
    live.write_text("{}")
    assert [bad.path for bad in DocumentLibrary(tmp_path).verify()] == [orphan]  # opening deletes nothing
    assert library.delete_orphans() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".lock", live.name, "doc-a.json"])
    assert library.verify() == [] and [doc.id for doc in DocumentLibrary(tmp_path).all()] == ["doc-a"]
    assert DocumentLibrary(None).delete_orphans() == 0


# --- limits: what one client can make the library hold (and every listing return) ---


@pytest.mark.parametrize("name, fragment", [
    ("n" * 900_000, "900,000 characters, more than 255"),
    ("notes\nmore", "control character U+000A at character 6"),
    ("tab\there", "control character U+0009"),
    ("nul\x00", "control character U+0000"),
    ("line\u2028break", "control character U+2028"),
    ("", "is empty"),
], ids=["900KB", "newline", "tab", "nul", "line-separator", "empty"])
def test_a_name_too_long_or_with_a_control_character_is_refused_and_nothing_written(tmp_path, name, fragment):
    library = DocumentLibrary(tmp_path)
    with pytest.raises(DocumentError, match=re.escape(fragment)) as refused:
        library.add("doc-a", "text a", name)
    assert len(str(refused.value)) < 400  # the message shows the start of a long name, not all of it
    assert "choose a" in str(refused.value)
    with pytest.raises(DocumentError, match=re.escape(fragment)):
        library.check_room("doc-a", name)  # the pre-check a caller runs before encoding refuses it too
    assert len(DocumentLibrary(tmp_path)) == 0 and not list(tmp_path.glob("doc-*"))


def test_a_name_of_255_characters_is_taken(tmp_path):
    library = DocumentLibrary(tmp_path)
    library.add("doc-a", "text a", "é" * 255)
    assert DocumentLibrary(tmp_path).resolve("é" * 255).id == "doc-a"


def test_a_document_takes_16_names_and_refuses_a_17th_naming_the_fix(tmp_path):
    library = DocumentLibrary(tmp_path)
    for i in range(16):
        library.add("doc-a", "text a", f"alias-{i}")
    with pytest.raises(DocumentError, match=r"document doc-a already has 16 names.*reuse one of them.*remove the "
                                            r"document"):
        library.add("doc-a", "text a", "alias-16")
    with pytest.raises(DocumentError, match="already has 16 names"):
        library.check_room("doc-a", "alias-16")
    library.add("doc-a", "text a", "alias-3")  # a name it has: nothing new
    library.add("doc-a", "text a", None)
    assert DocumentLibrary(tmp_path).resolve("doc-a").names == [f"alias-{i}" for i in range(16)]


def test_a_library_refuses_a_new_document_beyond_max_documents_even_from_a_stale_view(tmp_path):
    stale = DocumentLibrary(tmp_path, max_documents=2)  # as a process that opened the library before the others
    library = DocumentLibrary(tmp_path, max_documents=2)
    library.add("doc-a", "text a", "a")
    library.add("doc-b", "text b", None)
    with pytest.raises(DocumentError, match="max_documents=2"):
        stale.check_room("doc-c", None)  # the pre-check re-reads the files too
    for view in (library, stale):
        with pytest.raises(DocumentError, match=r"holds 2 documents, its limit \(max_documents=2\); remove one.*"
                                                "raise max_documents"):
            view.add("doc-c", "text c", "c")
    stale.add("doc-a", "text a", "a2")  # an existing text takes another name: not a new document
    assert DocumentLibrary(tmp_path).resolve("a2").id == "doc-a"
    library.remove("doc-b")
    stale.add("doc-c", "text c", "c")  # room again
    assert sorted(d.id for d in DocumentLibrary(tmp_path).all()) == ["doc-a", "doc-c"]


def test_max_documents_must_be_positive(tmp_path):
    with pytest.raises(PromptCacheError, match="max_documents=0: must be at least 1"):
        DocumentLibrary(tmp_path, max_documents=0)


def test_the_limits_hold_in_memory_too():
    library = DocumentLibrary(None, max_documents=1)
    library.add("doc-a", "text a", "a")
    with pytest.raises(DocumentError, match="max_documents=1"):
        library.add("doc-b", "text b", None)
    with pytest.raises(DocumentError, match="more than 255"):
        library.add("doc-a", "text a", "x" * 256)


def _document_key(doc_id: str, model: str = "model-A"):
    from pc_cpu.pml.encoding import content_digest
    from pc_cpu.store.document_library import document_label
    from pc_cpu.store.keys import StoreKey

    return StoreKey(model=model, content=content_digest("doc", doc_id, model), mode="document",
                    label=document_label(doc_id))


def test_removing_a_document_takes_its_entry_and_its_encodings_from_every_tier_and_nothing_else():
    from pc_cpu.store.document_library import remove_document
    from pc_cpu.store.ram import RamStore
    from tests.store.conftest import entry, key

    library = DocumentLibrary(None)
    kept = library.add("doc-" + "1" * 16, "Kept text.", "kept.txt")
    gone = library.add("doc-" + "2" * 16, "Gone text.", "gone.txt")
    tiers = [RamStore(1 << 20), RamStore(1 << 20)]
    for tier in tiers:
        for doc in (kept, gone):
            tier.put(_document_key(doc.id), entry(64))
            tier.put(_document_key(doc.id, model="model-B"), entry(64))
        tier.put(key("paris"), entry(64))

    removed = remove_document(library, tiers, "gone.txt")

    assert (removed.id, removed.names, removed.encodings) == (gone.id, ("gone.txt",), 4)
    assert library.get(gone.id) is None and library.get(kept.id) is not None
    for tier in tiers:
        assert sorted(k.label for k in tier.keys()) == sorted(["document " + kept.id] * 2 + ["trip/paris"])


def test_removing_an_id_without_a_library_entry_still_takes_its_encodings_and_an_unknown_one_nothing():
    from pc_cpu.store.document_library import remove_document
    from pc_cpu.store.ram import RamStore
    from tests.store.conftest import entry

    orphan = "doc-" + "3" * 16
    tier = RamStore(1 << 20)
    tier.put(_document_key(orphan), entry(64))

    assert remove_document(DocumentLibrary(None), [tier], "doc-" + "4" * 16) is None
    assert remove_document(None, [tier], "nothing.txt") is None
    removed = remove_document(None, [tier], orphan)
    assert (removed.id, removed.names, removed.encodings) == (orphan, (), 1) and tier.keys() == []


def test_a_store_label_names_a_document_only_when_it_is_one():
    from pc_cpu.store.document_library import document_label, labelled_document

    assert labelled_document(document_label("doc-" + "5" * 16)) == "doc-" + "5" * 16
    assert labelled_document("trip/paris") is None
    assert labelled_document(document_label("#preamble")) is None


def test_a_document_s_stand_ins_are_the_ones_added_before_it_and_do_not_change_as_the_library_grows(tmp_path):
    library = DocumentLibrary(tmp_path)
    ids = []
    for i in range(10):
        ids.append(f"doc-{i:016x}")
        library.add(ids[-1], f"text {i}", None)
        time.sleep(0.002)  # `added` orders them
    found = library.stand_ins(ids + ["doc-new"])
    assert [d.id for d in found[ids[3]]] == ids[:3]  # the first four: the ones before each
    assert [d.id for d in found[ids[6]]] == ids[:4]  # later groups: the group before
    assert [d.id for d in found["doc-new"]] == ids[4:8]  # not in the library: the place the next add takes
    library.add("doc-" + "f" * 16, "later", None)
    assert [d.id for d in library.stand_ins([ids[6]])[ids[6]]] == ids[:4]  # adding later changes nothing


def test_recorded_stand_ins_survive_a_removal_elsewhere_and_a_reload_and_give_way_when_one_goes(tmp_path):
    library = DocumentLibrary(tmp_path)
    ids = [f"doc-{i:016x}" for i in range(9)]
    for i, doc_id in enumerate(ids):
        before = [d.id for d in library.stand_ins([doc_id])[doc_id]]  # as add_document records them
        library.add(doc_id, f"text {i}", None, after=before)
        time.sleep(0.002)
    assert [d.id for d in library.stand_ins([ids[8]])[ids[8]]] == ids[4:8]
    library.remove(ids[0])  # every later document's place moves down by one
    reopened = DocumentLibrary(tmp_path)
    assert [d.id for d in reopened.stand_ins([ids[8]])[ids[8]]] == ids[4:8]  # recorded, not the places now
    reopened.remove(ids[5])  # one of its own stand-ins: the places as they are now decide
    assert [d.id for d in reopened.stand_ins([ids[8]])[ids[8]]] == [ids[1], ids[2], ids[3], ids[4]]


def test_a_document_file_without_recorded_stand_ins_reads_as_before(tmp_path):
    import json

    library = DocumentLibrary(tmp_path)
    library.add("doc-" + "a" * 16, "first", None)
    (tmp_path / ("doc-" + "b" * 16 + ".json")).write_text(json.dumps(
        {"id": "doc-" + "b" * 16, "text": "second", "names": [], "added": time.time() + 1,
         "after": "not a list"}), encoding="utf-8")
    reopened = DocumentLibrary(tmp_path)
    assert reopened.get("doc-" + "a" * 16).after is None and reopened.get("doc-" + "b" * 16).after is None
    assert [d.id for d in reopened.stand_ins(["doc-" + "b" * 16])["doc-" + "b" * 16]] == ["doc-" + "a" * 16]


def test_removing_a_document_takes_the_stand_in_contexts_and_prefixes_holding_it():
    from pc_cpu.store.document_library import prefix_label, remove_document, stand_ins_label
    from pc_cpu.store.ram import RamStore
    from tests.store.conftest import entry

    a, b, c = ("doc-" + ch * 16 for ch in "abc")
    library = DocumentLibrary(None)
    for doc_id in (a, b, c):
        library.add(doc_id, f"text {doc_id}", None)
    tier = RamStore(1 << 20)
    labelled = {stand_ins_label([a, b]): "context-ab", stand_ins_label([c]): "context-c",
                prefix_label([b, c]): "prefix-bc", "document preamble": "preamble"}
    for label, content in labelled.items():
        tier.put(_keyed(content, label), entry(64))
    removed = remove_document(library, [tier], b)
    assert removed.encodings == 2
    assert sorted(k.label for k in tier.keys()) == sorted([stand_ins_label([c]), "document preamble"])


def _keyed(content: str, label: str):
    from pc_cpu.store.keys import StoreKey

    return StoreKey(model="model-A", content=content, mode="document", label=label)
