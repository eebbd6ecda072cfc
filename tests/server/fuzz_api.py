"""Gives the fuzz of the HTTP API that tests/server/test_fuzz.py runs short and bench/fuzz.py runs long.

A request is a valid one (a conversation, a PML prompt, a document, a schema) with 0 to 3 of its
fields then changed to anything JSON can hold (wrong types, numbers at the limits, odd Unicode,
huge strings, the OpenAI fields this server does not implement), or a body that is not a JSON
object at all. Each request carries the names a refusal of it must mention: the fields changed,
or a value it quoted (an unknown document's name).

The oracle (`problems`) every answer must pass:
- no 5xx, and no filesystem path or traceback in any body (unless the request sent that text);
- a refusal is a 4xx JSON error whose message names one of the request's names;
- a 2xx parses with the `openai` client's own types (each streamed chunk too), and does not
  silently ignore a field the server refuses (pc_cpu.server.openai_api.UNSUPPORTED).

The server must hold what `prepare` loads: schemas 's' and 'c' and the document 'boats'. Nothing
the fuzz sends removes them: it deletes and adds only its own names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional
from urllib.parse import quote

import openai.types.chat.completion_create_params as chat_params
import openai.types.completion_create_params as completion_params
from hypothesis import strategies as st
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from pc_cpu.server.openai_api import unsupported_fields

SCHEMA_S = '<schema name="s"><module name="doc">A short note about boats and the sea.</module></schema>'
SCHEMA_C = ('<schema name="c"><system>You answer questions.</system>'
            '<user><module name="doc">A note about boats.</module></user></schema>')
DOCUMENT = {"text": "Boats float on the sea. The harbour keeps them safe at night.", "name": "boats"}
KEPT_NAMES = ("s", "c", "boats")  # what prepare() loads; the fuzz never deletes or redefines them
FUZZ_NAMES = ("fz0", "fz1", "fz2", "fz3")  # documents and schemas the fuzz adds and deletes
HUGE_CHARS = 20_000  # a prompt ~5,000 tokens: past any test context, within the 1 MiB body limit
OVERSIZED_BYTES = (1 << 20) + 1  # one byte over the server's default --max-body-bytes

# Written into a response by the server's own machinery, never by a client's text.
LEAKS = ("/work", "/tmp", "/root", "/home", "site-packages", ".py", "Traceback", 'File "')


def prepare(client) -> None:
    """Loads the schemas and the document every generated request may name; raises if the server refuses."""
    for pml in (SCHEMA_S, SCHEMA_C):
        client.post("/v1/schemas", json={"pml": pml}).raise_for_status()
    client.post("/v1/documents", json=DOCUMENT).raise_for_status()


# --- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzRequest:
    """One request of the fuzz, and what a refusal of it must name."""

    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    names: tuple[str, ...] = ()  # a refusal's message must hold one (identifiers as words, others as text)

    def describe(self, limit: int = 600) -> str:
        """Returns the request as one line for a report; long bodies cut to `limit` characters."""
        body = "" if self.body is None else self.body.decode("utf-8", "backslashreplace")
        body = body if len(body) <= limit else f"{body[:limit]}... ({len(self.body):,} bytes)"
        return f"{self.method} {self.path} [{self.content_type}] {body} (names: {', '.join(self.names)})"


class Raw:
    """A JSON value written as given: a number no Python float or int prints (`1e99999`, 5,000 digits)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:20]}{'...' if len(self.text) > 20 else ''})"


def encode(value: Any, *, ascii_only: bool = True) -> bytes:
    """Returns `value` as JSON bytes: NaN and Infinity written raw, Raw values as given.

    ascii_only=False writes text as UTF-8, a lone surrogate as its 3 bytes (CESU-8, which
    Python's JSON reader accepts); otherwise it is a `\\udXXX` escape.
    """
    raws: list[str] = []

    def swap(item):
        if isinstance(item, Raw):
            raws.append(item.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(item, dict):
            return {key: swap(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [swap(inner) for inner in item]
        return item

    text = json.dumps(swap(value), ensure_ascii=ascii_only)
    for index, raw in enumerate(raws):
        marker = json.dumps(f"\x00raw{index}\x00", ensure_ascii=ascii_only)
        text = text.replace(marker, raw)
    return text.encode("utf-8", "surrogatepass")


ODD_TEXT = ["", " ", "\x00", "\u200f", "\u202e", "\u200b", "\ufeff", "\U0001F6A4", "\U0001F468\u200d\U0001F469",
            "e\u0301\u0301", "\u0300", "\ud800", "\udfff", "\uffff", "\U0010FFFF", "\r\n", "\t", "\x1b[31m",
            "<doc/>", "<doc>", "</user>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<![CDATA[", "]]>",
            "&amp;", "&#0;", "{{ x }}", "%s", "\\", '"', "'", "/tmp/x.py", "../../etc/passwd", "\uff57\uff49"]
EDGE_INTS = [0, -1, 1, 2, 4, 255, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.5, -1.5, 5e-324, 1e-308, 1e39, 1e308, -1e308,
               float("nan"), float("inf"), float("-inf")]
RAW_NUMBERS = [Raw("1" + "0" * 5000), Raw("-" + "9" * 4400), Raw("1e99999"), Raw("-0"), Raw("1E400")]

huge_texts = st.builds(lambda piece, count: piece * count,
                       st.sampled_from(["word ", "\U0001F6A4", "a", "<doc/>", "\x00"]),
                       st.integers(HUGE_CHARS // 10, HUGE_CHARS))
odd_texts = st.lists(st.sampled_from(ODD_TEXT) | st.text(max_size=4), max_size=6).map("".join)
# Huge texts one time in ten: each costs a tokenization of ~20,000 characters.
texts = st.one_of(*[st.text(max_size=30)] * 4, *[odd_texts] * 5, huge_texts)
short_texts = st.text(max_size=12) | st.sampled_from(ODD_TEXT)
numbers = st.sampled_from(EDGE_INTS) | st.integers() | st.sampled_from(EDGE_FLOATS) | st.floats()
scalars = st.none() | st.booleans() | numbers | short_texts | texts | st.sampled_from(RAW_NUMBERS)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(short_texts, inner, max_size=4), max_leaves=8)


def _anything(specific: st.SearchStrategy) -> st.SearchStrategy:
    """Returns the values a field is set to: mostly ones chosen for it, sometimes any JSON."""
    return st.one_of(specific, specific, json_values)


max_tokens_values = st.sampled_from([0, -1, 1, 4, 2**31, 2**63, 10**30, 1.5, 4.0, "4", "four", True, None, 1e308]) | \
    st.sampled_from(RAW_NUMBERS)
tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
stop_values = st.one_of(texts, st.lists(short_texts, max_size=5), st.lists(json_values, max_size=5),
                        st.lists(st.text(max_size=10), min_size=100, max_size=2000),
                        st.sampled_from([[""], [], None, ["\n", "\n\n"], [" "] * 4]))
document_refs = st.sampled_from(["boats", *FUZZ_NAMES, "nope", ""]) | short_texts
FIELD_VALUES = {
    "max_tokens": max_tokens_values,
    "max_completion_tokens": max_tokens_values,
    "n": st.sampled_from([0, -1, 1, 2, 128, 1.0, "1", True, 2**64]),
    "best_of": st.sampled_from([0, 1, 2, 1.0]),
    "stop": stop_values,
    "stream": st.sampled_from([True, False, "true", "yes", 1, 0, "maybe", []]),
    "temperature": numbers | st.floats(0, 2) | st.sampled_from(["0.5", "hot"]),
    "top_p": numbers | st.floats(0, 1),
    "top_k": numbers,
    "seed": numbers,
    "use_cache": st.sampled_from([True, False, "false", 0, None]),
    "recompute": st.sampled_from(["all", "none", "tail:2", "select:10%", "tail:-1", "sometimes", ""]) | short_texts,
    "tools": st.sampled_from([[], [tool], [tool, tool], [{"type": "code"}], [[]]]),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}]),
    "functions": st.sampled_from([[], [tool["function"]]]),
    "function_call": st.sampled_from(["auto", "none", {"name": "lookup"}]),
    "logprobs": st.sampled_from([True, False, 0, 1, 5]),
    "top_logprobs": st.sampled_from([0, 1, 20, 21, -1]),
    "logit_bias": st.sampled_from([{}, {"50256": -100}, {"x": "y"}]),
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"},
                                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}]),
    "echo": st.booleans(),
    "suffix": short_texts,
    "modalities": st.sampled_from([["text"], ["text", "audio"], []]),
    "verbosity": st.sampled_from(["low", "medium", "high"]),
    "stream_options": st.sampled_from([{"include_usage": True}, {"include_usage": False}]),
    "documents": st.lists(document_refs, max_size=3),
    "schema": st.sampled_from(["c", "s", "nope", ""]) | short_texts,
    "setting": st.sampled_from(["fast", "accurate", "slow"]),
    "order": st.sampled_from(["given", "relevant-first", "relevant-last", "random"]),
    "prefix": st.sampled_from(["background", "first", "off", "on"]),
    "encoding": st.sampled_from(["library", "preamble", "zip"]),
    "after_edit": st.sampled_from(["recompute", "reuse", "sometimes"]),
    "model": short_texts,
    "prompt": st.lists(texts, max_size=3) | texts,
    "text": texts,
    "name": short_texts | st.sampled_from(FUZZ_NAMES),
    "system": texts,
    "pml": texts,
}


def _openai_fields(params) -> list[str]:
    return sorted(params.CompletionCreateParamsBase.__required_keys__ |
                  params.CompletionCreateParamsBase.__optional_keys__)


# Every field a client may send: OpenAI's own (as the installed client knows them) and this server's.
CHAT_FIELDS = sorted(set(_openai_fields(chat_params)) | {"top_k", "use_cache", "recompute", "schema", "documents",
                                                         "setting", "order", "prefix", "encoding", "after_edit"})
COMPLETION_FIELDS = sorted(set(_openai_fields(completion_params)) | {"top_k", "use_cache", "recompute"})


def field_values(name: str) -> st.SearchStrategy:
    return _anything(FIELD_VALUES.get(name, json_values))


ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "", "USER", "user ",
                         "wizard"]) | short_texts
content_parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.just({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}),
    st.just({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}),
    st.fixed_dictionaries({"type": short_texts, "text": json_values}),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": short_texts}), max_size=2),
    json_values)
contents = st.one_of(texts, st.lists(content_parts, max_size=4), st.none(), json_values)


@st.composite
def _plain_messages(draw, *, question: bool) -> list[dict]:
    """Returns valid messages: a system message or none, then one user message, or turns ending with the user's."""
    messages = [{"role": draw(st.sampled_from(["system", "developer"])), "content": draw(texts)}] \
        if draw(st.booleans()) else []
    turns = 0 if question else draw(st.integers(0, 2))
    for _ in range(turns):
        messages += [{"role": "user", "content": "Hi " + draw(short_texts)},
                     {"role": "assistant", "content": draw(short_texts)}]
    content = "Why " + draw(texts) + "?"  # never empty: a conversation needs a user's words
    if draw(st.booleans()):
        content = [{"type": "text", "text": "Why "}, {"type": "text", "text": content[4:]}]
    return messages + [{"role": "user", "content": content}]


def _sampling(draw) -> dict:
    """Returns valid sampling options with a short answer: the fuzz is after the server, not the model."""
    body = {"max_tokens": draw(st.integers(1, 4))}
    options = {"temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(0, 50),
               "seed": st.integers(0, 2**32 - 2),
               "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=4),
               "stream": st.booleans(), "use_cache": st.booleans(), "model": st.just("tiny")}
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=4, unique=True)):
        body[name] = draw(options[name])
    return body


@st.composite
def chat_requests(draw) -> FuzzRequest:
    kind = draw(st.sampled_from(["conversation", "schema", "documents"]))
    body = _sampling(draw)
    if kind == "schema":
        body |= {"schema": "c", "messages": [{"role": "user", "content": "<doc/> " + draw(texts)}]}
    elif kind == "documents":
        body |= {"documents": ["boats"], "messages": draw(_plain_messages(question=True)), "prefix": "off"}
        body |= draw(st.sampled_from([{}, {"setting": "fast"}, {"setting": "accurate"}, {"order": "given"},
                                      {"order": "relevant-first"}]))  # a setting chooses the order itself
    else:
        body["messages"] = draw(_plain_messages(question=False))
    # The messages' text is the client's: a refusal of it (an import never closed, an overflow) names it.
    names = ["messages", "message", "content", "conversation", "question"]
    return _mutated(draw, "POST", "/v1/chat/completions", body, CHAT_FIELDS, names, message_ops=True)


@st.composite
def completion_requests(draw) -> FuzzRequest:
    text = draw(texts).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    prompt = f'<prompt schema="s"><doc/> {text}</prompt>'
    body = _sampling(draw) | {"prompt": [prompt] if draw(st.booleans()) else prompt}
    return _mutated(draw, "POST", "/v1/completions", body, COMPLETION_FIELDS, ["prompt"])


@st.composite
def document_requests(draw) -> FuzzRequest:
    action = draw(st.sampled_from(["add", "add", "add", "list", "delete"]))
    if action == "list":
        return FuzzRequest("GET", "/v1/documents", None, None)
    if action == "delete":
        ref = draw(st.sampled_from(FUZZ_NAMES) | st.text(max_size=12).filter(lambda t: t not in KEPT_NAMES))
        return FuzzRequest("DELETE", "/v1/documents/" + quote(ref, safe=""), None, None, (repr(ref), "document"))
    body = {"text": "Note: " + draw(texts)}
    body |= draw(st.fixed_dictionaries({}, optional={"name": st.sampled_from(FUZZ_NAMES), "system": texts}))
    # The library's limits and a name already taken are refusals about the text and the name given.
    return _mutated(draw, "POST", "/v1/documents", body, ["text", "name", "system"],
                    ["text", "name", "system", "document"])


@st.composite
def schema_requests(draw) -> FuzzRequest:
    action = draw(st.sampled_from(["add", "add", "list", "delete"]))
    if action == "list":
        return FuzzRequest("GET", "/v1/schemas", None, None)
    name = draw(st.sampled_from(FUZZ_NAMES))
    if action == "delete":
        return FuzzRequest("DELETE", f"/v1/schemas/{name}", None, None, (repr(name),))
    text = draw(texts).replace("&", "&amp;").replace("<", "&lt;")
    body = {"pml": f'<schema name="{name}"><module name="m">Note: {text}</module></schema>'}
    # The PML is the client's: a refusal of it (a control character, an overflow) names the module.
    return _mutated(draw, "POST", "/v1/schemas", body, ["pml"], ["pml", "schema", "module"])


VALID_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    "/v1/completions": {"prompt": '<prompt schema="s"><doc/> Hi</prompt>', "max_tokens": 1},
    "/v1/documents": {"text": "A note about harbours."},
    "/v1/schemas": {"pml": f'<schema name="{FUZZ_NAMES[0]}"><module name="m">A note.</module></schema>'},
}


@st.composite
def raw_requests(draw) -> FuzzRequest:
    """Returns a request whose body is not a JSON object, or is one sent the wrong way."""
    path = draw(st.sampled_from(sorted(VALID_BODIES)))
    valid = encode(VALID_BODIES[path])
    kind = draw(st.sampled_from(["bytes", "truncated", "not an object", "content type", "oversized", "deep"]))
    if kind == "content type":
        content_type = draw(st.sampled_from([None, "text/plain", "application/x-www-form-urlencoded",
                                             "multipart/form-data; boundary=x", "application/xml", "",
                                             "application/json; charset=latin-1", "application/jsonx"]))
        return FuzzRequest("POST", path, valid, content_type, ("Content-Type", "body"))
    body = {"bytes": draw(st.binary(max_size=64)),
            "truncated": valid[:draw(st.integers(0, len(valid) - 1))],
            "not an object": encode(draw(json_values.filter(lambda v: not isinstance(v, dict)))),
            "oversized": b'{"text": "' + b"x" * OVERSIZED_BYTES + b'"}',
            "deep": b"[" * draw(st.integers(900, 100_000))}[kind]
    return FuzzRequest("POST", path, body, "application/json", ("body", "JSON"))


def _mutated(draw, method: str, path: str, body: dict, fields: list[str], names: list[str], *,
             message_ops: bool = False) -> FuzzRequest:
    """Returns the request of `body` after 0 to 3 changes; each change adds the names a refusal may give."""
    body, names = dict(body), list(names)
    ops = ["set"] * 6 + ["delete"] + (["message"] * 3 if message_ops else [])
    for op in draw(st.lists(st.sampled_from(ops), max_size=3)):
        if op == "delete" and body:
            name = draw(st.sampled_from(sorted(body)))
            del body[name]
            names.append(name)
        elif op == "message" and isinstance(body.get("messages"), list) and body["messages"]:
            names += _change_a_message(draw, body)
        else:
            name = draw(st.sampled_from(fields) | short_texts)
            body[name] = value = draw(field_values(name))
            names.append(name if _is_utf8(name) else "key")  # "... of a key of the body": it cannot be quoted
            if name == "documents" and isinstance(value, list):  # an unknown one is a 404 quoting its name
                names += [repr(ref) for ref in value if isinstance(ref, str)]
    return FuzzRequest(method, path, encode(body, ascii_only=draw(st.booleans())), "application/json",
                       tuple(dict.fromkeys(names)))


def _change_a_message(draw, body: dict) -> list[str]:
    """Changes one message of body["messages"]; returns the names a refusal of it may give."""
    messages = body["messages"] = list(body["messages"])
    index = draw(st.integers(0, len(messages) - 1))
    what = draw(st.sampled_from(["role", "content", "extra", "whole", "append"]))
    if what == "whole" or not isinstance(messages[index], dict):  # an earlier change may have made it a number
        messages[index] = draw(json_values)
        return ["messages", "message"]
    if what == "append":
        messages.append(draw(st.fixed_dictionaries({"role": ROLES, "content": contents})))
        return ["messages", "message", "role", "content"]
    message = messages[index] = dict(messages[index])
    key = {"role": "role", "content": "content"}.get(what) or draw(st.sampled_from(
        ["name", "tool_calls", "tool_call_id", "refusal", "function_call"]) | short_texts)
    message[key] = draw({"role": ROLES, "content": contents}.get(key, json_values))
    return ["messages", "message", key]


requests = st.one_of(*[chat_requests()] * 4, *[completion_requests()] * 2, *[document_requests()] * 2,
                     schema_requests(), raw_requests())


# --- the oracle --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What the server said: its status, content type and body as text."""

    status: int
    content_type: str
    text: str


def send(client, request: FuzzRequest) -> Answer:
    """Returns the server's answer to `request`, sent with `client` (an httpx.Client on the server's base URL)."""
    headers = {} if request.content_type is None else {"content-type": request.content_type}
    response = client.request(request.method, request.path, content=request.body, headers=headers)
    return Answer(response.status_code, response.headers.get("content-type", ""), response.text)


def problems(request: FuzzRequest, answer: Answer) -> list[str]:
    """Returns what is wrong with `answer` to `request` (empty when it passes every oracle)."""
    if answer.status >= 500:
        return [f"{answer.status}: {answer.text[:300]}"]
    found = _leaks(request, answer)
    if 200 <= answer.status < 300:
        found += _answer_problems(request, answer)
    elif 400 <= answer.status < 500:
        found += _refusal_problems(request, answer)
    else:
        found.append(f"status {answer.status} is neither an answer nor a refusal")
    return found


def _leaks(request: FuzzRequest, answer: Answer) -> list[str]:
    sent = (request.body or b"").decode("utf-8", "replace") + request.path
    text = _without_generated_text(answer)
    return [f"the answer holds {leak!r}: {text[max(0, text.find(leak) - 80):text.find(leak) + 80]!r}"
            for leak in LEAKS if leak in text and leak not in sent]


def _without_generated_text(answer: Answer) -> str:
    """Returns the answer's text with the model's words blanked: a random model may well write '.py'."""
    if not 200 <= answer.status < 300:
        return answer.text
    payloads = _events(answer.text) if answer.content_type.startswith("text/event-stream") else [_json(answer.text)]
    for payload in payloads:
        for choice in (payload.get("choices") or []) if isinstance(payload, dict) else []:
            if isinstance(choice, dict):
                choice.pop("text", None)
                for part in (choice.get("message"), choice.get("delta")):
                    if isinstance(part, dict):
                        part.pop("content", None)
    return json.dumps(payloads)


def _answer_problems(request: FuzzRequest, answer: Answer) -> list[str]:
    body = _json(request.body.decode("utf-8", "surrogatepass")) if _is_text(request.body) else None
    found = [f"accepted although refused on purpose: {refusal}" for refusal in unsupported_fields(body)]
    route = (request.method, request.path)
    streamed = answer.content_type.startswith("text/event-stream")
    if isinstance(body, dict) and body.get("stream") is True and not streamed:
        found.append("stream: true answered without server-sent events")
    if isinstance(body, dict) and body.get("stream") in (False, None) and streamed:
        found.append("a request without stream: true answered with server-sent events")
    if route == ("POST", "/v1/chat/completions"):
        found += _parses(answer, ChatCompletionChunk if streamed else ChatCompletion, streamed)
    elif route == ("POST", "/v1/completions"):
        found += _parses(answer, CompletionChunk if streamed else Completion, streamed)
    else:
        payload = _json(answer.text)
        if not isinstance(payload, dict) or "error" in payload or not payload.get("object"):
            found.append(f"a {answer.status} answer is not an API object: {answer.text[:300]}")
    return found


class _StreamedChoice(CompletionChoice):
    finish_reason: Optional[Literal["stop", "length", "content_filter"]] = None


class CompletionChunk(Completion):
    """A streamed completion: OpenAI's own chunks carry finish_reason null until the last one.

    The client reads them as Completion without validating (openai.Stream), so Completion's
    required finish_reason would refuse what OpenAI itself sends.
    """

    choices: list[_StreamedChoice]


def _parses(answer: Answer, kind, streamed: bool) -> list[str]:
    """Returns why the answer (each chunk, when streamed, then [DONE]) does not parse as the openai `kind`."""
    payloads = _events(answer.text) if streamed else [_json(answer.text)]
    if streamed and (not payloads or payloads[-1] != "[DONE]"):
        return [f"the stream does not end with [DONE]: {answer.text[-300:]!r}"]
    for payload in payloads[:-1] if streamed else payloads:
        try:
            kind.model_validate(payload)
        except Exception as exc:  # noqa: BLE001  (pydantic's ValidationError, or a non-dict payload)
            return [f"does not parse as {kind.__name__}: {str(exc)[:300]}; payload {str(payload)[:300]}"]
    return []


def _refusal_problems(request: FuzzRequest, answer: Answer) -> list[str]:
    payload = _json(answer.text)
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error.get("type"):
        return [f"a {answer.status} that is not a JSON error: {answer.text[:300]}"]
    message = error["message"]
    if answer.status == 413:  # the body's size: the limit's flag names the fix
        return [] if "--max-body-bytes" in message else [f"a 413 that does not name --max-body-bytes: {message}"]
    if not any(_names(message, name) for name in request.names):
        return [f"a {answer.status} that names none of {', '.join(request.names) or '(nothing: a valid request)'}: "
                f"{message[:400]}"]
    return []


def _names(message: str, name: str) -> bool:
    """Returns whether `message` names `name`: a field as a whole word, anything else as written."""
    if re.fullmatch(r"[A-Za-z_][\w-]*", name):
        return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message, re.IGNORECASE) is not None
    return name in message


def _events(text: str) -> list:
    """Returns the `data:` payloads of a server-sent event stream, parsed; '[DONE]' stays a string."""
    events = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else _json(data))
    return events


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _is_text(body: bytes | None) -> bool:
    """Returns whether `body` decodes as UTF-8, lone surrogates allowed (as Python's JSON reader reads it)."""
    try:
        return body is not None and bool(body.decode("utf-8", "surrogatepass"))
    except UnicodeDecodeError:
        return False


def _json(text: str):
    """Returns `text` parsed as JSON, numbers too long for an int as infinities; None when it is not JSON."""
    try:
        return json.loads(text, parse_int=lambda digits: int(digits) if len(digits) < 4000 else float("inf"))
    except (ValueError, RecursionError):
        return None
