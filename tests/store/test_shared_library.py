"""The document library in Redis: servers adding and removing names at once lose nothing, and a name never names two texts."""

from __future__ import annotations

import pytest

from pc_cpu.errors import DocumentError, DocumentLimitError, StoreUnavailableError
from pc_cpu.store.document_library import DocumentLibrary, remove_document
from pc_cpu.store.remote import RemoteStore
from pc_cpu.store.shared_library import LIBRARY_KEY
from tests.store.conftest import blob_entry, key
from tests.store.test_document_library import ROUNDS, run_two  # run_two passes the URL where it passes a directory


def shared_library(url: str, **kwargs) -> DocumentLibrary:
    """Returns a library on the Redis at `url`, as a server given --remote-store opens it."""
    return DocumentLibrary(shelf=RemoteStore(url).library_shelf(), **kwargs)


def _name_one_text(url, worker: int, barrier, results) -> None:
    library = shared_library(url)
    barrier.wait()
    for i in range(ROUNDS // 2):
        library.add("doc-shared", "the shared text", f"w{worker}-{i}")
    results.put(worker)


def _claim_names(url, worker: int, barrier, results) -> None:
    library = shared_library(url)
    for i in range(ROUNDS):
        barrier.wait()
        try:
            library.add(f"doc-w{worker}", f"the text of worker {worker}", f"notes-{i}")
            results.put((i, worker, "won"))
        except DocumentError as exc:
            results.put((i, worker, str(exc)))


def _add_and_remove(url, worker: int, barrier, results) -> None:
    """One process adds documents of its own while removing the other's: every change lands, none is lost."""
    library = shared_library(url)
    barrier.wait()
    for i in range(ROUNDS):
        library.add(f"doc-{worker}-{i}", f"text {worker} {i}", f"name-{worker}-{i}")
        if i % 2:
            library.remove(f"doc-{worker}-{i - 1}")
    results.put(worker)


def test_names_given_to_one_text_at_once_by_two_servers_all_survive(redis_url):
    assert sorted(run_two(_name_one_text, redis_url)) == [0, 1]
    names = shared_library(redis_url).resolve("doc-shared").names
    assert sorted(names) == sorted(f"w{w}-{i}" for w in (0, 1) for i in range(ROUNDS // 2))


def test_a_name_claimed_by_two_servers_for_different_texts_goes_to_one(redis_url):
    outcomes = run_two(_claim_names, redis_url)
    library = shared_library(redis_url)
    for i in range(ROUNDS):
        (winner,) = [w for r, w, what in outcomes if r == i and what == "won"]
        (lost,) = [what for r, w, what in outcomes if r == i and what != "won"]
        assert f"name 'notes-{i}' already names document doc-w{winner} with other text" in lost
        assert library.resolve(f"notes-{i}").id == f"doc-w{winner}"
        assert sum(f"notes-{i}" in doc.names for doc in library.all()) == 1


def test_adds_and_removes_at_once_all_land(redis_url):
    assert sorted(run_two(_add_and_remove, redis_url)) == [0, 1]
    ids = sorted(doc.id for doc in shared_library(redis_url).all())
    assert ids == sorted(f"doc-{w}-{i}" for w in (0, 1) for i in range(ROUNDS) if i % 2)


def test_a_stale_view_checks_and_resolves_against_redis(redis_url):
    first, second, third = (shared_library(redis_url) for _ in range(3))
    second.add("doc-b", "text b", "notes")
    with pytest.raises(DocumentError, match="'notes' already names document doc-b with other text"):
        first.add("doc-a", "text a", "notes")
    assert third.resolve("notes").id == "doc-b"
    second.remove("doc-b")
    first.add("doc-a", "text a", "notes")
    assert shared_library(redis_url).resolve("notes").id == "doc-a"


def test_the_limit_of_documents_counts_every_server(redis_url):
    first, second = shared_library(redis_url, max_documents=2), shared_library(redis_url, max_documents=2)
    first.add("doc-a", "a", None)
    second.add("doc-b", "b", None)
    with pytest.raises(DocumentLimitError, match="holds 2 documents"):
        first.add("doc-c", "c", None)


def test_an_unreadable_document_in_redis_is_skipped(redis_url, redis_server, caplog):
    library = shared_library(redis_url)
    library.add("doc-a", "a", "a")
    redis_server.client().hset(LIBRARY_KEY, "doc-bad", b"{not json")
    assert [d.id for d in shared_library(redis_url).all()] == ["doc-a"]
    assert "doc-bad" in caplog.text


def test_while_redis_is_down_names_still_resolve_and_changes_are_refused_naming_it(own_redis):
    library = shared_library(own_redis.url)
    library.add("doc-a", "text a", "notes")
    own_redis.stop()
    assert library.resolve("notes").id == "doc-a"  # the last view read serves questions
    with pytest.raises(StoreUnavailableError, match="cannot be reached"):
        library.resolve("unknown")  # not seen here: it may well be in Redis, so not a 404
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{own_redis.port}.*cannot be reached"):
        library.add("doc-b", "text b", "other")
    with pytest.raises(StoreUnavailableError, match="cannot be reached"):
        library.remove("doc-a")
    own_redis.start()
    library.shelf._link._retry_at = 0
    library.add("doc-b", "text b", "other")  # back: a change lands again
    assert [d.id for d in shared_library(own_redis.url).all()] == ["doc-b"]  # Redis restarted empty


def test_removing_a_document_takes_its_encodings_from_redis_too(redis_url):
    remote = RemoteStore(redis_url)
    library = DocumentLibrary(shelf=remote.library_shelf())
    library.add("doc-a", "text a", "notes")
    doc_key = key("x")
    labelled = type(doc_key)(doc_key.model, doc_key.content, "document", label="document doc-a")
    remote.put(labelled, blob_entry(1000))
    remote.put(key("module"), blob_entry(1000))
    removed = remove_document(library, [remote], "notes")
    assert (removed.id, removed.encodings) == ("doc-a", 1)
    assert not remote.contains(labelled) and remote.contains(key("module")) and len(library) == 0
