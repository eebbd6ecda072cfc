"""The HTTP API over real HTTP: schemas, completions, chat, streaming and errors."""

from __future__ import annotations

import json

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.prompt import parse_prompt
from tests.server.conftest import DOC_PROMPT, sse_events


def test_health_and_models_name_the_loaded_gguf(client, server_cache):
    health = client.get("/health").json()
    assert health["status"] == "ok" and {"s", "c"} <= set(health["schemas"])
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [server_cache.model.path.name] == [health["model"]]


def test_stats_report_the_caches_tiers_queues_memory_and_the_process(client, server_cache):
    stats = client.get("/v1/stats").json()
    assert stats["object"] == "stats" and stats["schemas"] == len(server_cache.schemas.names)
    assert stats["tiers"]["ram"]["budget_bytes"] == server_cache.store.tier("ram").budget_bytes
    assert set(stats["queues"]) == {"active", "waiting", "held_streams", "idle_tasks"}
    assert stats["memory"] == server_cache.memory().to_dict()
    process = stats["process"]
    assert process["rss_bytes"] > stats["memory"]["kv"] and process["open_files"] > 0 and process["threads"] > 1


def test_schemas_register_list_and_delete(client):
    pml = '<schema name="extra"><module name="a">First part.</module><module name="b">Second.</module></schema>'
    created = client.post("/v1/schemas", json={"pml": pml})
    assert created.status_code == 201
    assert created.json()["name"] == "extra" and created.json()["modules"] == ["a", "b"]
    assert created.json()["length"] > 0
    assert "extra" in [s["name"] for s in client.get("/v1/schemas").json()["data"]]
    answer = client.post("/v1/completions", json={"prompt": '<prompt schema="extra"><a/> go</prompt>', "max_tokens": 2})
    assert answer.status_code == 200 and answer.json()["usage"]["cached_tokens"] > 0
    assert client.delete("/v1/schemas/extra").json()["deleted"] is True
    assert "extra" not in [s["name"] for s in client.get("/v1/schemas").json()["data"]]
    missing = client.delete("/v1/schemas/extra")
    assert missing.status_code == 404 and "not loaded" in missing.json()["error"]["message"]


def test_completion_equals_the_library_greedy_answer(client, server_cache):
    expected = server_cache.generate(DOC_PROMPT, max_tokens=16)
    body = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 16}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == expected.text
    assert body["choices"][0]["finish_reason"] == expected.finish_reason == "length"
    usage = body["usage"]
    assert (usage["cached_tokens"], usage["uncached_tokens"]) == (expected.cached_tokens, expected.uncached_tokens)
    assert usage["prompt_tokens"] == expected.prompt_tokens and usage["completion_tokens"] == 16
    assert usage["total_tokens"] == expected.prompt_tokens + 16 and usage["ttft_ms"] > 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == expected.cached_tokens
    assert body["tiers"] == expected.tiers


def test_use_cache_false_is_the_full_prefill_baseline(client, server_cache):
    body = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4, "use_cache": False}).json()
    assert body["usage"]["cached_tokens"] == 0
    assert body["usage"]["uncached_tokens"] == server_cache.generate(DOC_PROMPT, max_tokens=4).prompt_tokens


def test_recompute_reaches_the_library_and_a_bad_one_is_a_400(client, server_cache):
    expected = server_cache.generate(DOC_PROMPT, max_tokens=6, recompute="all")
    body = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 6, "recompute": "all"}).json()
    assert body["choices"][0]["text"] == expected.text
    bad = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "recompute": "sometimes"})
    assert bad.status_code == 400 and "sometimes" in bad.text


def test_sampling_options_and_stop_reach_the_library(client, server_cache):
    options = {"max_tokens": 12, "temperature": 1.5, "top_k": 40, "top_p": 0.9, "seed": 3}
    expected = server_cache.generate(DOC_PROMPT, **options)
    body = client.post("/v1/completions", json={"prompt": DOC_PROMPT, **options}).json()
    assert body["choices"][0]["text"] == expected.text
    full = expected.text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    body = client.post("/v1/completions", json={"prompt": DOC_PROMPT, **options, "stop": stop}).json()
    assert body["choices"][0] == {"index": 0, "text": full[: full.find(stop)], "finish_reason": "stop",
                                  "logprobs": None}


def test_streamed_pieces_concatenate_to_the_answer_and_end_with_done(client):
    whole = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 16}).json()
    with client.stream("POST", "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 16, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 16


def test_chat_answers_like_the_equivalent_pml_prompt(client, server_cache):
    expected = server_cache.generate('<prompt schema="c"><doc/><user>What does it say?</user></prompt>', max_tokens=12)
    messages = [{"role": "user", "content": "<doc/> What does it say?"}]
    body = client.post("/v1/chat/completions", json={"schema": "c", "messages": messages, "max_tokens": 12}).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert body["usage"]["cached_tokens"] == expected.cached_tokens > 0
    parts = [{"type": "text", "text": "<doc/> What does "}, {"type": "text", "text": "it say?"}]
    again = client.post("/v1/chat/completions", json={"schema": "c", "max_tokens": 12,
                                                       "messages": [{"role": "user", "content": parts}]}).json()
    assert again["choices"][0]["message"]["content"] == expected.text


def test_chat_streams_openai_chunks(client):
    body = {"schema": "c", "messages": [{"role": "user", "content": "<doc/> Hi"}], "max_tokens": 8}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    with client.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == whole
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_bad_pml_is_400_with_the_library_message(client, stream):
    bad = '<prompt schema="s"><doc/>'
    with pytest.raises(PromptCacheError) as raised:
        parse_prompt(bad)
    error = _error(client.post("/v1/completions", json={"prompt": bad, "stream": stream}), 400)
    assert error == {"message": str(raised.value), "type": "PMLSyntaxError"}
    error = _error(client.post("/v1/completions", json={"prompt": '<prompt schema="s"><nope/></prompt>'}), 400)
    assert error["type"] == "PromptError" and "no module 'nope'" in error["message"]


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("option, fragment", [
    ({"temperature": -1}, "temperature=-1.0: must be a finite number >= 0"),
    ({"temperature": 1e39}, "temperature=1e+39: must be a finite number >= 0"),
    ({"top_k": 4294967297}, "top_k=4294967297: must be an integer in 0..2147483647"),  # was silently top_k=1
    ({"top_k": -1}, "top_k=-1: must be an integer in 0..2147483647"),
    ({"seed": -1}, "seed=-1: must be an integer in 0..4294967294"),
    ({"seed": 2**40}, "seed=1099511627776: must be an integer in 0..4294967294"),
    ({"top_p": 0}, "top_p=0.0: must be a number in (0, 1]"),
    ({"max_tokens": 0}, "body.max_tokens: Input should be greater than or equal to 1"),
])
def test_a_sampling_option_out_of_range_is_422_naming_it_and_its_range(client, url, option, fragment):
    body = {"prompt": DOC_PROMPT, "schema": "c", "messages": [{"role": "user", "content": "hi"}], **option}
    error = _error(client.post(url, json=body), 422)
    assert error["type"] == "RequestValidationError" and fragment in error["message"]


@pytest.mark.parametrize("url, field, value", [
    ("/v1/completions", "temperature", "NaN"),
    ("/v1/completions", "top_p", "Infinity"),
    ("/v1/chat/completions", "temperature", "-Infinity"),
])
def test_a_sampling_option_that_is_not_a_finite_number_is_422(client, url, field, value):
    body = ('{"prompt": %s, "schema": "c", "messages": [{"role": "user", "content": "hi"}], "%s": %s}'
            % (json.dumps(DOC_PROMPT), field, value))  # raw: NaN is not JSON, but Python's parser reads it
    error = _error(client.post(url, content=body, headers={"content-type": "application/json"}), 422)
    assert error["type"] == "RequestValidationError"
    assert f"body.{field}: Input should be a finite number" in error["message"]


def test_unknown_schema_in_chat_is_400_naming_the_loaded_ones(client):
    body = {"schema": "nope", "messages": [{"role": "user", "content": "hi"}]}
    error = _error(client.post("/v1/chat/completions", json=body), 400)
    assert error["type"] == "UnknownSchemaError" and "'nope'" in error["message"] and "s, c" in error["message"]


def test_bad_role_is_400(client):
    body = {"schema": "c", "messages": [{"role": "tool", "content": "hi"}]}
    assert "role 'tool'" in _error(client.post("/v1/chat/completions", json=body), 400)["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_that_overflows_the_context_is_400(client, stream):
    prompt = '<prompt schema="s"><doc/> ' + "word " * 3000 + "</prompt>"
    error = _error(client.post("/v1/completions", json={"prompt": prompt, "stream": stream}), 400)
    assert error["type"] == "ContextOverflowError" and "raise n_ctx" in error["message"]
    assert client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 2}).status_code == 200


def test_a_schema_larger_than_the_context_is_400(client):
    pml = '<schema name="huge"><module name="m">' + "word " * 3000 + "</module></schema>"
    assert _error(client.post("/v1/schemas", json={"pml": pml}), 400)["type"] == "ContextOverflowError"


@pytest.mark.parametrize("content, kwargs", [
    ("missing prompt", {"json": {"max_tokens": 3}}),
    ("wrong type", {"json": {"prompt": DOC_PROMPT, "max_tokens": "many"}}),
    ("bad json", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
    ("chat without messages", {"json": {"max_tokens": 3}}),
    ("chat with no message", {"json": {"messages": []}}),
])
def test_malformed_bodies_are_422_json(client, content, kwargs):
    url = "/v1/chat/completions" if "chat" in content else "/v1/completions"
    error = _error(client.post(url, **kwargs), 422)
    assert error["type"] == "RequestValidationError" and error["message"].startswith("invalid request")
