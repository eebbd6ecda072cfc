"""Tools over the HTTP API, through the `openai` client: calls in OpenAI's shape, streamed as deltas, sent back."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import sse_events

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}
MESSAGES = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def oai(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60, max_retries=0)
    yield client
    client.close()


def test_a_required_call_comes_back_in_openais_shape_and_its_result_is_the_next_steps_new_text(oai):
    first = oai.chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=48)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    history = MESSAGES + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "grey"}'}]
    second = oai.chat.completions.create(model="m", messages=history, tools=[WEATHER], max_tokens=6)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    baseline = oai.chat.completions.create(model="m", messages=history, tools=[WEATHER], max_tokens=6,
                                           extra_body={"use_cache": False})
    assert second.choices[0].message.content == baseline.choices[0].message.content


def test_streamed_calls_are_deltas_that_add_up_to_the_whole_answers(client):
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 48,
            "parallel_tool_calls": False}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    chunks = [c for c in sse_events(client.post("/v1/chat/completions", json=body | {"stream": True}))[:-1]
              if c["choices"]]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", ())]
    assert [d["index"] for d in deltas] == [0]
    assert deltas[0]["function"] == whole["message"]["tool_calls"][0]["function"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any("<tool_call>" in (c["choices"][0]["delta"].get("content") or "") for c in chunks)


@pytest.mark.parametrize("extra, status, fragment", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, 400, "tools[0].function.name='bad name'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400,
     "not among the tools (get_weather)"),
    ({"tool_choice": "required"}, 400, "needs tools"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, 400, "send one"),
    ({"tools": [WEATHER], "schema": "c"}, 422, "`tools` are for conversations"),
])
def test_tools_that_cannot_be_used_are_refused_naming_why(client, extra, status, fragment):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4} | extra)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]


def test_a_last_assistant_message_is_continued(client):
    start = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 6}).json()
    text = start["choices"][0]["message"]["content"]
    words = text.split(" ")
    prefill = " ".join(words[:2])
    body = {"messages": MESSAGES + [{"role": "assistant", "content": prefill}], "max_tokens": 4}
    continued = client.post("/v1/chat/completions", json=body).json()
    baseline = client.post("/v1/chat/completions", json=body | {"use_cache": False}).json()
    assert continued["choices"][0]["message"]["content"] == baseline["choices"][0]["message"]["content"]
    assert continued["usage"]["prompt_tokens"] > start["usage"]["prompt_tokens"]  # the prefilled text is prompt
    assert continued["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the turn before it, reused
