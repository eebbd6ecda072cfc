"""Two servers sharing one Redis behind no balancer affinity: each answers what the other computed; a Redis failure costs speed."""

from __future__ import annotations

import pytest

from tests.server.conftest import httpx

SYSTEM = "Answer from the notes."
BOATS = "Boats float because they push aside water heavier than themselves. Sails catch the wind."
QUESTIONS = ["What floats?", "Why?", "And sails?"]


@pytest.fixture
def servers(tiny_model_path, tmp_path, own_redis):
    """Returns HTTP clients of two servers, each with its own RAM and disk tier, sharing one Redis."""
    from pc_cpu import PromptCache
    from pc_cpu.server import ServerThread

    caches = [PromptCache(tiny_model_path, n_ctx=2048, threads=2, store=tmp_path / name, remote_store=own_redis.url)
              for name in ("a", "b")]
    threads = [ServerThread(cache).__enter__() for cache in caches]
    clients = [httpx.Client(base_url=thread.base_url, timeout=60) for thread in threads]
    yield clients, caches
    for client, thread, cache in zip(clients, threads, caches):
        client.close()
        thread.__exit__(None, None, None)
        cache.close()


def chat(client, cache, messages, **extra) -> dict:
    body = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **extra})
    assert body.status_code == 200, body.text
    cache.wait_idle()  # a reader's pause: the answer's cells are stored
    return body.json()


def test_a_conversation_whose_turns_land_on_either_server_answers_as_one_server(servers, tiny_model_path):
    from pc_cpu import PromptCache

    (a, b), (cache_a, cache_b) = servers
    messages, answers, usages = [{"role": "system", "content": SYSTEM}], [], []
    for turn, question in enumerate(QUESTIONS):
        client, cache = ((a, cache_a), (b, cache_b))[turn % 2]
        messages.append({"role": "user", "content": question})
        body = chat(client, cache, messages)
        answers.append(body["choices"][0]["message"]["content"])
        usages.append(body)
        messages.append({"role": "assistant", "content": answers[-1]})
    with PromptCache(tiny_model_path, n_ctx=2048, threads=2, store=False) as alone:
        expected = [alone.chat(messages[:2 + 2 * turn], max_tokens=8).text for turn in range(len(QUESTIONS))]
    assert answers == expected
    assert [body["tiers"] for body in usages[1:]] == [{"#conversation": "remote"}, {"#conversation": "remote"}]


def test_a_document_added_on_one_server_is_asked_on_the_other(servers):
    (a, b), (cache_a, cache_b) = servers
    added = a.post("/v1/documents", json={"text": BOATS, "name": "boats.txt"})
    assert added.status_code == 200, added.text
    ask = {"documents": ["boats.txt"], "messages": [{"role": "user", "content": "What floats?"}], "max_tokens": 8,
           "prefix": "off"}
    on_a = chat(a, cache_a, ask["messages"], **{k: v for k, v in ask.items() if k != "messages"})
    on_b = chat(b, cache_b, ask["messages"], **{k: v for k, v in ask.items() if k != "messages"})
    assert on_b["choices"][0]["message"] == on_a["choices"][0]["message"]
    assert set(on_b["tiers"].values()) == {"remote"} and cache_b.documents.encoded == 0
    assert [d["id"] for d in b.get("/v1/documents").json()["data"]] == [added.json()["id"]]


def test_redis_lost_refuses_library_changes_with_503_and_answers_everything_else(servers, own_redis):
    (a, b), (cache_a, cache_b) = servers
    assert a.post("/v1/documents", json={"text": BOATS, "name": "boats.txt"}).status_code == 200
    assert [d["names"] for d in b.get("/v1/documents").json()["data"]] == [["boats.txt"]]  # b has seen it
    own_redis.stop()
    refused = b.post("/v1/documents", json={"text": "Trains run on rails.", "name": "trains.txt"})
    assert refused.status_code == 503 and f"127.0.0.1:{own_redis.port}" in refused.json()["error"]["message"]
    assert b.delete("/v1/documents/boats.txt").status_code == 503
    asked = chat(b, cache_b, [{"role": "user", "content": "What floats?"}], documents=["boats.txt"], prefix="off")
    assert asked["choices"][0]["message"]["content"] is not None and cache_b.documents.encoded > 0  # computed locally
    talk = chat(a, cache_a, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}])
    assert talk["choices"][0]["message"]["content"] is not None
    own_redis.start()
    for cache in (cache_a, cache_b):
        cache.store.tier("remote").link._retry_at = 0  # the pause is over
    assert b.post("/v1/documents", json={"text": "Trains run on rails.", "name": "trains.txt"}).status_code == 200
