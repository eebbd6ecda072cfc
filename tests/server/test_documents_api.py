"""The document library over HTTP: POST|GET /v1/documents, DELETE /v1/documents/{id or name}, chat with `documents`."""

from __future__ import annotations

import httpx
import pytest

from pc_cpu.pml.document_layout import document_id
from pc_cpu.server import ServerThread
from pc_cpu.store.disk import DiskStore
from pc_cpu.store.document_library import document_label, held_documents
from tests.server.conftest import sse_events

BOATS = "Boats float on the sea. The harbour keeps them safe at night."
TRAINS = "Trains run on rails between the towns of the valley."
SYSTEM = "You answer from the documents."
KEY = "doc-test-key"


@pytest.fixture(scope="module")
def doc_cache(tiny_model_path, tmp_path_factory):
    """A PromptCache of its own, with a store of its own: its library holds only this module's documents."""
    from pc_cpu import PromptCache

    cache = PromptCache(tiny_model_path, n_ctx=1024, threads=2, n_seq_max=16,
                        store=tmp_path_factory.mktemp("doc-store"))
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def doc_server(doc_cache):
    with ServerThread(doc_cache) as running:
        yield running


@pytest.fixture
def http(doc_server):
    with httpx.Client(base_url=doc_server.base_url, timeout=30) as client:
        yield client


@pytest.fixture
def library(http, doc_cache):
    """Adds the boats (named boats.txt) and trains documents; removes every document after the test."""
    boats = http.post("/v1/documents", json={"text": BOATS, "name": "boats.txt", "system": SYSTEM})
    trains = http.post("/v1/documents", json={"text": TRAINS})
    assert boats.status_code == trains.status_code == 200, boats.text
    yield boats.json()["id"], trains.json()["id"]
    for doc in doc_cache.list_documents():
        doc_cache.remove_document(doc.id)


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _chat(documents, question="What floats?", system=SYSTEM, **extra) -> dict:
    """Returns a chat body over `documents`; prefix "off" unless told, so that it answers as an earlier ask did
    (not from the exact prefix that ask left behind)."""
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    return {"documents": documents, "messages": messages + [{"role": "user", "content": question}],
            "max_tokens": 6, "prefix": "off", **extra}


def test_adding_returns_the_id_of_the_text_and_the_same_text_keeps_it(http, library):
    boats, trains = library
    assert boats == document_id(BOATS) and trains == document_id(TRAINS) and boats != trains
    again = http.post("/v1/documents", json={"text": BOATS, "name": "boats-again"})
    assert again.status_code == 200 and again.json()["id"] == boats
    assert again.json()["names"] == ["boats.txt", "boats-again"]


def test_listing_shows_ids_names_and_sizes_but_not_the_texts(http, library, doc_cache):
    listing = http.get("/v1/documents")
    assert listing.status_code == 200
    rows = {row["id"]: row for row in listing.json()["data"]}
    assert list(rows) == list(library)  # oldest first
    boats = rows[library[0]]
    assert boats["names"] == ["boats.txt"] and boats["object"] == "document" and boats["chars"] == len(BOATS)
    assert boats["tokens"] > len(BOATS.split()) // 2 and boats["added"] > 0
    assert boats["preview"] == BOATS and "text" not in boats
    assert rows[library[1]]["names"] == []


def test_a_long_document_gets_a_short_preview(http, library):
    text = "A very long note. " * 20
    doc = http.post("/v1/documents", json={"text": text}).json()
    assert len(doc["preview"]) == 80 and doc["preview"].endswith("\u2026") and text.startswith(doc["preview"][:-1])


@pytest.mark.parametrize("body, status, fragment", [
    ({"text": "   "}, 400, "is empty"),
    ({"text": "\x00" * 100}, 400, "no printable character"),
    ({"text": "Other text.", "name": "boats.txt"}, 400, "already names document"),
    ({"text": "Some text.", "name": "doc-mine"}, 400, "looks like a document id"),
    ({"text": "word " * 3000}, 400, "split the document or raise n_ctx"),
    ({"name": "no text"}, 422, "body.text"),
    ({"text": "Some text.", "name": ""}, 422, "body.name"),
    ({"text": "Some text.", "name": "n" * 900_000}, 400, "900,000 characters, more than 255"),
    ({"text": "Some text.", "name": "notes\nmore"}, 400, "control character U+000A"),
])
def test_bad_documents_are_refused_with_the_library_message(http, library, body, status, fragment):
    error = _error(http.post("/v1/documents", json=body), status)
    assert fragment in error["message"]
    assert len(http.get("/v1/documents").json()["data"]) == 2  # nothing was added


def test_names_are_bounded_so_a_listing_is_too(http, library):
    boats, _ = library  # named boats.txt
    for i in range(15):
        assert http.post("/v1/documents", json={"text": BOATS, "name": f"alias-{i}"}).status_code == 200
    error = _error(http.post("/v1/documents", json={"text": BOATS, "name": "one-too-many"}), 400)
    assert f"document {boats} already has 16 names" in error["message"] and "reuse one" in error["message"]
    row = http.get("/v1/documents").json()["data"][0]
    assert len(row["names"]) == 16 and len(row["preview"]) <= 80


@pytest.mark.parametrize("question", ["", "  ", "\x00\x07"])
def test_an_empty_question_over_documents_is_a_400(http, library, question):
    error = _error(http.post("/v1/chat/completions", json=_chat(list(library), question=question)), 400)
    assert "the question is empty" in error["message"] and error["type"] == "PromptCacheError"


def test_chat_with_documents_answers_like_the_library_ask(http, library, doc_cache):
    boats, trains = library
    expected = doc_cache.ask("What floats?", documents=[boats, trains], system=SYSTEM, max_tokens=6, prefix="off")
    body = http.post("/v1/chat/completions", json=_chat([boats, trains])).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert body["usage"]["cached_tokens"] == expected.cached_tokens > 0
    assert body["usage"]["uncached_tokens"] == expected.uncached_tokens
    assert set(body["tiers"]) == {"#preamble", boats, trains} and "encoded" not in body["tiers"].values()


def test_names_work_like_ids_and_system_messages_join(http, library, doc_cache):
    boats, trains = library
    expected = doc_cache.ask("Which one runs?", documents=[trains, boats], system="Be brief.\n\nUse the notes.",
                             max_tokens=6, prefix="off")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use the notes."}]},
                {"role": "user", "content": "Which one runs?"}]
    body = http.post("/v1/chat/completions", json={"documents": [trains, "boats.txt"], "messages": messages,
                                                   "max_tokens": 6, "prefix": "off"}).json()
    assert body["choices"][0]["message"]["content"] == expected.text
    assert body["usage"]["prompt_tokens"] == expected.prompt_tokens


def test_a_document_added_for_a_system_message_is_asked_with_it_without_encoding(http, library):
    doc = http.post("/v1/documents", json={"text": "Ferries cross the bay.", "system": "  Be terse.\n"}).json()
    body = http.post("/v1/chat/completions", json=_chat([doc["id"]], system="Be terse.")).json()
    assert body["tiers"] == {"#preamble": "ram", doc["id"]: "ram"}  # both encoded when it was added


def test_chat_with_documents_streams_openai_chunks(http, library, doc_cache):
    boats, _ = library
    expected = doc_cache.ask("What floats?", documents=[boats], system=SYSTEM, max_tokens=6, prefix="off")
    with http.stream("POST", "/v1/chat/completions", json=_chat([boats], stream=True)) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected.text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["cached_tokens"] == expected.cached_tokens and boats in chunks[-1]["tiers"]


def test_use_cache_false_is_the_full_prefill_baseline(http, library):
    boats, _ = library
    body = http.post("/v1/chat/completions", json=_chat([boats], use_cache=False)).json()
    assert body["usage"]["cached_tokens"] == 0 and body["tiers"] == {}


def test_a_conversation_over_documents_answers_as_chat_does(http, library, doc_cache):
    messages = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "What floats?"}]
    expected = doc_cache.chat(messages, documents=list(library), max_tokens=6)
    body = http.post("/v1/chat/completions", json={"documents": list(library), "messages": messages,
                                                   "max_tokens": 6}).json()
    assert body["choices"][0]["message"]["content"] == expected.text
    assert body["usage"]["prompt_tokens"] == expected.prompt_tokens
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize("messages, fragment", [
    ([{"role": "user", "content": "Hi."}, {"role": "system", "content": "Late."}], "end with the user's message"),
    ([{"role": "system", "content": "Only a system message."}], "end with the user's message"),
])
def test_a_conversation_over_documents_that_cannot_be_answered_is_a_400_naming_why(http, library, messages, fragment):
    error = _error(http.post("/v1/chat/completions", json={"documents": [library[0]], "messages": messages}), 400)
    assert fragment in error["message"]


def test_setting_is_for_one_question_over_documents(http, library):
    messages = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "?"}]
    error = _error(http.post("/v1/chat/completions", json={"documents": [library[0]], "messages": messages,
                                                           "setting": "fast"}), 422)
    assert "for one question over `documents`" in error["message"]


def test_documents_do_not_mix_with_a_schema(http, library):
    error = _error(http.post("/v1/chat/completions", json=_chat([library[0]], schema="s")), 422)
    assert "not both" in error["message"]


def test_recompute_with_documents_answers_as_ask_does_and_a_bad_one_is_a_400(http, library, doc_cache):
    expected = doc_cache.ask("What floats?", documents=list(library), system=SYSTEM, max_tokens=6, prefix="off",
                             recompute="all")
    body = http.post("/v1/chat/completions", json=_chat(list(library), recompute="all")).json()
    assert body["choices"][0]["message"]["content"] == expected.text
    assert body["usage"]["uncached_tokens"] == expected.uncached_tokens > len(doc_cache.documents.tokens(TRAINS))
    error = _error(http.post("/v1/chat/completions", json=_chat(list(library), recompute="select:10%@module")), 400)
    assert "@module" in error["message"] and "head:K, tail:K" in error["message"]


def test_setting_and_order_with_documents_answer_as_ask_does_and_without_documents_are_a_422(http, library,
                                                                                             doc_cache):
    question = "What runs on rails between the towns?"  # about the second document: relevant:1 computes it
    for options in ({"setting": "accurate"}, {"order": "relevant-first"}):
        expected = doc_cache.ask(question, documents=list(library), system=SYSTEM, max_tokens=6, prefix="off",
                                 **options)
        body = http.post("/v1/chat/completions", json=_chat(list(library), question, **options)).json()
        assert body["choices"][0]["message"]["content"] == expected.text, options
        assert body["usage"]["uncached_tokens"] == expected.uncached_tokens, options
    # "accurate" computes the exact prefix in the first question: the baseline's answer, every token computed.
    full = doc_cache.ask(question, documents=list(library), system=SYSTEM, max_tokens=6, use_cache=False)
    accurate = doc_cache.ask(question, documents=list(library), system=SYSTEM, max_tokens=6, setting="accurate")
    assert accurate.token_ids == full.token_ids and accurate.cached_tokens == 0
    error = _error(http.post("/v1/chat/completions", json=_chat(list(library), setting="best")), 400)
    assert "setting='best' is not a setting" in error["message"]
    error = _error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "schema": "s", "setting": "accurate"}), 422)
    assert "`setting`, `order`, `prefix` and `encoding` are for questions over `documents`" in error["message"]


def test_chat_without_schema_or_documents_is_a_plain_conversation(http):
    answer = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_document_in_chat_is_404_naming_it(http, library, stream):
    error = _error(http.post("/v1/chat/completions", json=_chat([library[0], "nope.txt"], stream=stream)), 404)
    assert error["type"] == "UnknownDocumentError" and "'nope.txt'" in error["message"]
    assert http.post("/v1/chat/completions", json=_chat([library[0]])).status_code == 200  # nothing stuck


def test_deleting_a_document_removes_it_and_its_encodings_only(http, library, doc_cache):
    boats, trains = library
    disk = next(tier for tier in doc_cache.store.tiers if isinstance(tier, DiskStore))

    def stored(doc_id):  # its encodings, and entries holding its text (stand-in contexts, exact prefixes)
        return sum(key.label == document_label(doc_id) or doc_id in held_documents(key.label) for key in disk.keys())

    assert stored(boats) >= 1 and stored(trains) >= 1
    others = len(disk.keys()) - stored(boats)
    deleted = http.delete("/v1/documents/boats.txt")  # by name
    assert deleted.status_code == 200 and deleted.json() == {"id": boats, "object": "document",
                                                             "names": ["boats.txt"], "deleted": True}
    assert stored(boats) == 0 and len(disk.keys()) == others and stored(trains) >= 1
    assert not (disk.directory / "documents" / f"{boats}.json").exists()
    assert [row["id"] for row in http.get("/v1/documents").json()["data"]] == [trains]
    assert _error(http.delete(f"/v1/documents/{boats}"), 404)["type"] == "UnknownDocumentError"
    assert _error(http.post("/v1/chat/completions", json=_chat([boats])), 404)["type"] == "UnknownDocumentError"
    answer = http.post("/v1/chat/completions", json=_chat([trains], system=None))  # as it was added
    assert answer.status_code == 200 and set(answer.json()["tiers"].values()) == {"ram"}  # nothing encoded
    assert http.delete(f"/v1/documents/{trains}").json()["deleted"] is True  # by id


def test_a_name_with_a_slash_can_be_deleted(http, library):
    doc = http.post("/v1/documents", json={"text": "Notes in a folder.", "name": "notes/today.md"}).json()
    assert http.delete("/v1/documents/notes/today.md").json()["id"] == doc["id"]


def test_the_document_routes_need_the_api_key(doc_cache, library):
    boats, _ = library
    with ServerThread(doc_cache, api_key=KEY) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        for method, url, body in [("GET", "/v1/documents", None), ("POST", "/v1/documents", {"text": "Hello."}),
                                  ("DELETE", f"/v1/documents/{boats}", None),
                                  ("POST", "/v1/chat/completions", _chat([boats]))]:
            refused = http.request(method, url, json=body)
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"
        held = doc_cache.documents.library
        assert held.get(document_id("Hello.")) is None and held.get(boats) is not None
        auth = {"Authorization": f"Bearer {KEY}"}
        assert http.post("/v1/chat/completions", json=_chat([boats]), headers=auth).status_code == 200
        assert http.get("/v1/documents", headers=auth).status_code == 200


def test_a_document_over_the_body_limit_is_413(doc_cache):
    with ServerThread(doc_cache, max_body_bytes=2000) as server:
        refused = httpx.post(server.base_url + "/v1/documents", json={"text": "word " * 1000}, timeout=30)
    assert refused.status_code == 413 and "--max-body-bytes" in refused.json()["error"]["message"]
    assert doc_cache.documents.library.get(document_id("word " * 1000)) is None


class FakeRequest:
    """A request whose client is there for `polls` checks, then gone."""

    def __init__(self, polls: int):
        self.polls = polls

    async def is_disconnected(self) -> bool:
        self.polls -= 1
        return self.polls < 0


def test_an_add_whose_client_leaves_is_cancelled():
    import asyncio
    import threading

    from pc_cpu.errors import AddCancelledError
    from pc_cpu.server.app import until_disconnected

    cancel = threading.Event()

    def work():  # an add that would run for 30 s unless cancelled (PromptCache.add_document's contract)
        if cancel.wait(timeout=30):
            raise AddCancelledError("cancelled")
        return "finished"

    with pytest.raises(AddCancelledError):
        asyncio.run(until_disconnected(FakeRequest(polls=1), work, cancel))
    assert cancel.is_set()
    assert asyncio.run(until_disconnected(FakeRequest(polls=10**6), lambda: "done", threading.Event())) == "done"


def test_prefix_with_documents_answers_as_the_baseline_and_a_bad_one_is_a_422(http, library, doc_cache):
    question = "Which one floats on the sea?"
    baseline = doc_cache.ask(question, documents=list(library), system=SYSTEM, max_tokens=6, use_cache=False)
    first = http.post("/v1/chat/completions", json=_chat(list(library), question, prefix="first")).json()
    again = http.post("/v1/chat/completions", json=_chat(list(library), question, prefix="background")).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"] == baseline.text
    assert set(again["tiers"].values()) == {"context"}  # the exact prefix "first" left in its slot
    error = _error(http.post("/v1/chat/completions", json=_chat(list(library), prefix="always")), 422)
    assert "prefix='always': use one of background, first, off" in error["message"]


def test_encoding_with_documents_answers_as_ask_does_and_a_bad_one_is_a_422(http, library, doc_cache):
    for encoding in ("library", "preamble"):
        expected = doc_cache.ask("What floats?", documents=list(library), system=SYSTEM, max_tokens=6, prefix="off",
                                 encoding=encoding)
        body = http.post("/v1/chat/completions", json=_chat(list(library), encoding=encoding)).json()
        assert body["choices"][0]["message"]["content"] == expected.text
    error = _error(http.post("/v1/chat/completions", json=_chat(list(library), encoding="chain")), 422)
    assert "encoding='chain': use one of library, preamble" in error["message"]
    error = _error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                           "encoding": "library"}), 422)
    assert "are for questions over `documents`" in error["message"]
