"""Two servers, each with its own RAM and disk, sharing one Redis: each answers what the other computed, as one server would."""

from __future__ import annotations

import pytest

from pc_cpu.errors import StoreUnavailableError
from tests.engine.test_documents import FUJI, PARIS, QUESTION

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."}
QUESTIONS = ["Name a large city by the sea.", "What is it known for?", "Name another one.", "Which is older?"]
SCHEMA = """<schema name="trip">
  <module name="paris">Paris is the capital of France, known for the Eiffel Tower and the Louvre.</module>
  <module name="tokyo">Tokyo is the capital of Japan, known for Shibuya and its fish market.</module>
</schema>"""


@pytest.fixture
def two_servers(make_cache, tmp_path, redis_url):
    """Returns a function making two caches on one model, with separate local stores and one shared Redis."""
    def make(**options):
        return [make_cache(store=tmp_path / f"server-{i}", remote_store=redis_url, **options) for i in "ab"]
    return make


def chat_turns(caches, questions, *, max_tokens=12):
    """Returns the Results of one conversation whose turn i goes to caches[i % len(caches)], a user reading in between."""
    messages, results = [SYSTEM], []
    for turn, question in enumerate(questions):
        cache = caches[turn % len(caches)]
        messages.append({"role": "user", "content": question})
        result = cache.chat(messages, max_tokens=max_tokens)
        results.append(result)
        messages.append({"role": "assistant", "content": result.text})
        cache.wait_idle()  # the answer's cells repaired and stored: what a reader's pause leaves time for
    return results


def test_a_conversation_alternating_between_two_servers_answers_as_one_server(two_servers, make_cache):
    a, b = two_servers(n_ctx=2048)
    alternating = chat_turns([a, b], QUESTIONS)
    alone = chat_turns([make_cache(n_ctx=2048, store=False)], QUESTIONS)
    assert [r.token_ids for r in alternating] == [r.token_ids for r in alone]
    for turn, result in enumerate(alternating[1:], start=1):  # every later turn reuses the other server's cells
        assert result.tiers == {"#conversation": "remote"}, turn
        assert result.cached_tokens == alone[turn].cached_tokens, turn


def test_a_document_added_on_one_server_is_asked_on_the_other_without_computing_it(two_servers):
    a, b = two_servers()
    a.add_document(PARIS, name="paris")
    a.add_document(FUJI, name="fuji")
    a.ask(QUESTION, documents=["fuji", "paris"], max_tokens=8)
    a.wait_idle()  # what a question leaves for the next one (an exact prefix) is stored too
    again = a.ask(QUESTION, documents=["fuji", "paris"], max_tokens=8)  # how one server answers it now
    a.wait_idle()
    assert {d.id for d in b.list_documents()} == {d.id for d in a.list_documents()}
    on_b = b.ask(QUESTION, documents=["fuji", "paris"], max_tokens=8)
    assert b.documents.encoded == 0 and set(on_b.tiers.values()) == {"remote"}
    assert on_b.token_ids == again.token_ids
    on_b_again = b.ask(QUESTION, documents=["fuji", "paris"], max_tokens=8)  # now in B's own RAM
    assert on_b_again.token_ids == again.token_ids and "remote" not in on_b_again.tiers.values()


def test_a_document_removed_on_one_server_is_gone_on_the_other(two_servers):
    a, b = two_servers()
    a.add_document(PARIS, name="paris")
    assert b.ask(QUESTION, documents=["paris"], max_tokens=2).text is not None
    b.remove_document("paris")
    with pytest.raises(Exception, match="no document has id or name 'paris'"):
        a.ask(QUESTION, documents=["paris"], max_tokens=2)


def test_a_schema_loaded_on_one_server_is_not_encoded_again_on_the_other(two_servers):
    a, b = two_servers()
    a.load_schema(SCHEMA)
    b.load_schema(SCHEMA)
    assert b.schemas.encoded == 0
    prompt = '<prompt schema="trip"><tokyo/><user>What is it known for?</user></prompt>'
    on_b = b.generate(prompt, max_tokens=8)
    assert on_b.tiers["tokyo"] == "context" and "encoded" not in on_b.tiers.values()
    assert on_b.token_ids == a.generate(prompt, max_tokens=8).token_ids


@pytest.mark.tiny_only
def test_redis_lost_mid_run_costs_speed_never_an_answer(make_cache, tmp_path, own_redis):
    a = make_cache(n_ctx=2048, store=tmp_path / "a", remote_store=own_redis.url)
    a.add_document(PARIS, name="paris")
    first = chat_turns([a], QUESTIONS[:2])
    asked = a.ask(QUESTION, documents=["paris"], max_tokens=8)
    own_redis.stop()
    alone = chat_turns([make_cache(n_ctx=2048, store=False)], QUESTIONS[:3])
    third = chat_turns([a], QUESTIONS[:3])[-1]  # the conversation again, and a new turn: from local tiers
    assert [r.token_ids for r in first] + [third.token_ids] == [r.token_ids for r in alone]
    assert a.ask(QUESTION, documents=["paris"], max_tokens=8).token_ids == asked.token_ids  # the name resolves
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{own_redis.port}"):
        a.add_document(FUJI, name="fuji")  # the shared library cannot change while Redis is down
    with pytest.raises(StoreUnavailableError):
        a.remove_document("paris")
    assert a.ask(QUESTION, documents=["paris"], max_tokens=8).token_ids == asked.token_ids  # nothing was lost


def test_redis_down_at_start_is_refused_unless_local_fallback(make_cache, tmp_path, own_redis):
    own_redis.stop()
    with pytest.raises(StoreUnavailableError, match="--store-fallback local"):
        make_cache(store=tmp_path / "a", remote_store=own_redis.url)
    cache = make_cache(store=tmp_path / "a", remote_store=own_redis.url, store_fallback="local")
    assert cache.chat([SYSTEM, {"role": "user", "content": QUESTIONS[0]}], max_tokens=4).text is not None
