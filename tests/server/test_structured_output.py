"""The server holds an answer to JSON (response_format) and applies the sampler's penalties; a bad schema is a 400."""

from __future__ import annotations

import json

from tests.server.conftest import DOC_PROMPT, sse_events

COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}}, "required": ["colour"]}
CHAT = {"messages": [{"role": "user", "content": "Pick a colour."}], "max_tokens": 32}
AS_COLOUR = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR, "strict": True}}


def test_a_json_schema_answer_parses_and_is_one_the_schema_admits(client):
    response = client.post("/v1/chat/completions", json=CHAT | {"response_format": AS_COLOUR})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) in ({"colour": "red"}, {"colour": "green"})


def test_a_streamed_json_schema_answer_is_the_same_text(client):
    whole = client.post("/v1/chat/completions", json=CHAT | {"response_format": AS_COLOUR}).json()
    with client.stream("POST", "/v1/chat/completions",
                       json=CHAT | {"response_format": AS_COLOUR, "stream": True}) as response:
        events = sse_events(response)
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert streamed == whole["choices"][0]["message"]["content"]


def test_a_schema_that_cannot_constrain_an_answer_is_a_400_naming_why(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    response = client.post("/v1/chat/completions", json=CHAT | {"response_format": bad})
    assert response.status_code == 400, response.text
    assert "Unrecognized schema" in response.json()["error"]["message"]
    response = client.post("/v1/chat/completions", json=CHAT | {"response_format": {"type": "yaml"}})
    assert response.status_code == 400 and "use one of text, json_object, json_schema" in response.text


def test_penalties_are_taken_and_out_of_range_ones_are_a_422_naming_them(client):
    ok = client.post("/v1/chat/completions", json=CHAT | {"presence_penalty": 0.5, "frequency_penalty": 0.5,
                                                            "repeat_penalty": 1.1, "min_p": 0.05})
    assert ok.status_code == 200, ok.text
    refused = client.post("/v1/chat/completions", json=CHAT | {"presence_penalty": 3})
    assert refused.status_code == 422 and "presence_penalty=3" in refused.text


def test_chat_logprobs_give_each_answer_tokens_and_the_likeliest_others(client):
    body = CHAT | {"max_tokens": 6, "logprobs": True, "top_logprobs": 3}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    for entry in content:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"]  # greedy: the chosen is the likeliest
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    plain = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 6}).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"]["content"] == choice["message"]["content"]


def test_streamed_logprobs_come_with_each_piece_and_are_the_whole_answers(client):
    body = CHAT | {"max_tokens": 8, "logprobs": True, "top_logprobs": 2}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    chunks = sse_events(client.post("/v1/chat/completions", json=body | {"stream": True}))
    pieces = [c["choices"][0] for c in chunks[:-1] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert pieces and all(piece["logprobs"]["content"] for piece in pieces)
    streamed = [entry for piece in pieces for entry in piece["logprobs"]["content"]]
    assert streamed == whole["logprobs"]["content"]
    assert "".join(entry["token"] for entry in streamed) == "".join(p["delta"]["content"] for p in pieces)


def test_top_logprobs_alone_is_a_422_naming_it(client):
    alone = client.post("/v1/chat/completions", json=CHAT | {"top_logprobs": 2})
    assert alone.status_code == 422 and "needs logprobs=true" in alone.text


def test_a_logit_bias_bans_the_token_greedy_decoding_chose(client, server_cache):
    first = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 1, "logprobs": True}).json()
    banned = first["choices"][0]["logprobs"]["content"][0]
    (token_id,) = server_cache.model.tokenize(bytes(banned["bytes"]).decode("utf-8"), special=False)
    again = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 1, "logprobs": True,
                                                             "logit_bias": {str(token_id): -100}}).json()
    assert again["choices"][0]["logprobs"]["content"][0]["bytes"] != banned["bytes"]
    refused = client.post("/v1/chat/completions", json=CHAT | {"logit_bias": {"word": 1}})
    assert refused.status_code == 400 and "logit_bias 'word'" in refused.text


def test_include_usage_ends_a_stream_with_a_usage_only_chunk(client):
    body = CHAT | {"max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    with client.stream("POST", "/v1/chat/completions", json=body | {"stream_options": None}) as response:
        assert all(e == "[DONE]" or e["choices"] for e in sse_events(response))


def test_n_choices_are_each_an_answer_and_sampled_ones_follow_their_seeds(client):
    greedy = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 6, "n": 3}).json()
    assert [c["index"] for c in greedy["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in greedy["choices"]}) == 1  # greedy: one answer, three times
    one = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 6}).json()
    assert greedy["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    assert greedy["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]  # one prompt, counted once
    sampled = CHAT | {"max_tokens": 12, "temperature": 1.5, "seed": 7}
    two = client.post("/v1/chat/completions", json=sampled | {"n": 2}).json()["choices"]
    alone = client.post("/v1/chat/completions", json=sampled | {"seed": 8}).json()["choices"][0]
    assert two[1]["message"]["content"] == alone["message"]["content"]  # choice i is seed + i
    refused = client.post("/v1/chat/completions", json=CHAT | {"n": 2, "stream": True})
    assert refused.status_code == 422 and "n=2 with stream=true" in refused.text
    completions = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4, "n": 2}).json()
    assert [c["index"] for c in completions["choices"]] == [0, 1]
    assert completions["choices"][0]["text"] == completions["choices"][1]["text"]
