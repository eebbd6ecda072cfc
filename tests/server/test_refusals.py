"""Refusals that name what to fix: what the HTTP API fuzz (tests/server/test_fuzz.py) found answered otherwise.

- OpenAI fields the server does not implement (best_of, echo, ...) were
  answered with a 200 that ignored them; now a 422 names each (openai_api.UNSUPPORTED).
- A body the JSON reader could not read (an integer of 5,000 digits, bytes that are not UTF-8,
  nesting deeper than it recurses) was a 400 "There was an error parsing the body".
- A body sent without Content-Type: application/json was a 422 that never said so.
- A chat message importing a module twice ("<doc/> ... <doc/>") was refused as a module imported
  twice, at "line 1" of a prompt the client never wrote; a schema's chat too long for the context
  was refused as a "prompt".
"""

from __future__ import annotations

import json

import openai.types.chat.completion_create_params as chat_params
import openai.types.completion_create_params as completion_params
import pytest

from pc_cpu.pml.chat import ChatMessage
from pc_cpu.server.chat import messages_to_pml
from pc_cpu.server.http_errors import MAX_PROBLEMS, validation_message
from pc_cpu.server.openai_api import IGNORED, UNSUPPORTED, ChatRequest, CompletionRequest
from tests.server.conftest import DOC_PROMPT

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
COMPLETION = {"prompt": DOC_PROMPT, "max_tokens": 1}


def _error(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def _post_raw(client, url: str, body: bytes, content_type: str | None = "application/json"):
    return client.post(url, content=body, headers={"content-type": content_type} if content_type else {})


@pytest.mark.parametrize("url, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
@pytest.mark.parametrize("field, value, fragment", [
    ("functions", [{"name": "f"}], "the legacy functions field is not taken; send them as `tools`"),
    ("function_call", "auto!", "the legacy function_call field is not taken"),
    ("best_of", 3, "best_of=3: this server samples one answer"),
    ("echo", True, "echo=true: this server does not echo the prompt"),
])
def test_an_unsupported_openai_field_is_a_422_naming_it_and_the_fix(client, url, body, field, value, fragment):
    message = _error(client.post(url, json=body | {field: value}), 422)
    assert f"{field}=" in message and fragment in message


@pytest.mark.parametrize("url, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_an_unsupported_field_asking_for_what_the_server_does_anyway_is_answered(client, url, body):
    neutral = {"n": 1, "logprobs": False, "tools": [], "tool_choice": "none", "presence_penalty": 0,
               "frequency_penalty": 0.0, "response_format": {"type": "text"}, "logit_bias": {}, "top_logprobs": None,
               "user": "someone", "stream_options": {"include_usage": True}}
    response = client.post(url, json=body | neutral)
    assert response.status_code == 200, response.text


def test_every_refusal_of_several_fields_names_each(client):
    message = _error(client.post("/v1/chat/completions", json=CHAT | {"functions": [{}], "best_of": 2}), 422)
    assert "functions=[{}]" in message and "best_of=2" in message


@pytest.mark.parametrize("field, value", [("tools", [{"type": "function", "function": {"name": "f"}}]),
                                          ("tool_choice", "required"), ("parallel_tool_calls", False)])
def test_tools_on_completions_are_a_422_pointing_at_chat(client, field, value):
    message = _error(client.post("/v1/completions", json=COMPLETION | {field: value}), 422)
    assert f"{field}=" in message and "/v1/chat/completions" in message


@pytest.mark.parametrize("value, fragment", [(True, "logprobs=true: on /v1/completions logprobs is an integer"),
                                             (6, "less than or equal to 5")])
def test_logprobs_on_completions_not_in_the_legacy_shape_are_a_422_naming_it(client, value, fragment):
    assert fragment in _error(client.post("/v1/completions", json=COMPLETION | {"logprobs": value}), 422)


@pytest.mark.parametrize("top", [0, 3])  # in the legacy shape 0 asks too: the chosen tokens' alone
def test_completion_logprobs_come_in_the_legacy_shape(client, top):
    choice = client.post("/v1/completions", json=COMPLETION | {"max_tokens": 5, "logprobs": top}).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert all(lp <= 0 for lp in logprobs["token_logprobs"]) and all(len(t) == top for t in logprobs["top_logprobs"])
    assert logprobs["text_offset"] == [sum(map(len, logprobs["tokens"][:i])) for i in range(len(logprobs["tokens"]))]


@pytest.mark.parametrize("params, model", [(chat_params, ChatRequest), (completion_params, CompletionRequest)])
def test_every_openai_request_field_is_implemented_refused_or_ignored_on_purpose(params, model):
    # A field the installed openai client knows and this server has never heard of would be
    # silently ignored: it must be implemented, or listed in UNSUPPORTED or IGNORED.
    known = {field.alias or name for name, field in model.model_fields.items()}
    known |= {field.name for field in UNSUPPORTED} | set(IGNORED)
    base = params.CompletionCreateParamsBase
    assert sorted(set(base.__required_keys__ | base.__optional_keys__) - known) == []


@pytest.mark.parametrize("field", ["max_tokens", "seed", "temperature"])
def test_a_number_too_long_for_an_int_is_a_422_naming_its_field(client, field):
    body = json.dumps(CHAT)[:-1] + f', "{field}": -{"9" * 5000}}}'  # past Python's 4,300-digit int limit
    message = _error(_post_raw(client, "/v1/chat/completions", body.encode()), 422)
    assert f"body.{field}: Input should be a finite number" in message


def test_a_number_too_long_in_an_ignored_field_is_ignored_as_the_field_is(client):
    body = json.dumps(CHAT)[:-1] + f', "user": {"1" * 5000}}}'
    assert _post_raw(client, "/v1/chat/completions", body.encode()).status_code == 200


@pytest.mark.parametrize("body, fragment", [
    (b'{"messages": "\xff"}', "body: not JSON at character 14: byte 0xff is not UTF-8"),
    (b"[" * 100_000, "body: not JSON at character 0: arrays or objects nested too deeply to read"),
    (b'{"messages": [}', "body: not JSON at character 14: Expecting value"),
    (b"", "body: empty; send one JSON object"),
])
def test_a_body_the_json_reader_cannot_read_is_a_422_saying_why(client, body, fragment):
    message = _error(_post_raw(client, "/v1/chat/completions", body), 422)
    assert fragment in message


@pytest.mark.parametrize("content_type, shown", [
    (None, "no Content-Type"),
    ("application/x-www-form-urlencoded", "Content-Type 'application/x-www-form-urlencoded'"),  # curl -d's
    ("text/plain", "Content-Type 'text/plain'"),
])
def test_a_json_body_sent_as_another_type_is_a_422_naming_the_header(client, content_type, shown):
    message = _error(_post_raw(client, "/v1/chat/completions", json.dumps(CHAT).encode(), content_type), 422)
    assert f"body: send a JSON object with the header Content-Type: application/json (this one has {shown})" \
        in message


def test_a_validation_message_shows_the_first_problems_and_counts_the_rest():
    errors = [{"loc": ("body", "stop", "list[str]", i), "msg": "Input should be a valid string"} for i in range(2000)]
    message = validation_message(errors, "application/json")
    assert message.count("Input should be a valid string") == MAX_PROBLEMS
    assert message.endswith(f"; and {2000 - MAX_PROBLEMS} more")


def test_an_import_repeated_in_one_message_is_imported_once():
    pml = messages_to_pml("c", [ChatMessage("user", "<doc/> Compare <doc/> with <doc/>.")], import_names={"doc"})
    assert pml == '<prompt schema="c"><doc/><user>Compare  with .</user></prompt>'


def test_a_chat_message_repeating_an_import_is_answered(client):
    body = {"schema": "c", "messages": [{"role": "user", "content": "<doc/> and <doc/> again?"}], "max_tokens": 2}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("content, fragment", [
    ("<doc/> " + "word " * 3000, "messages: prompt needs "),  # raised by the scheduler, after the stream opened
    ("<doc/> then <doc></doc>", "messages: module 'doc' is imported twice; import it once"),  # raised when planned
])
def test_a_schemas_chat_that_cannot_be_answered_names_the_messages_without_a_prompt_line(client, content, fragment):
    body = {"schema": "c", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    message = _error(client.post("/v1/chat/completions", json=body), 400)
    assert message.startswith(fragment) and "line" not in message
