"""Gives the OpenAI-style wire shapes of the server: request bodies and the JSON of answers and chunks.

Differences from OpenAI, on purpose:
- `prompt` (completions) is a PML `<prompt schema="...">` document. Chat takes any conversation
  (system/developer, user and assistant messages, the last one the user's), answered with the
  model's own chat template by PromptCache.chat, which reuses the cells of the turns it has seen
  (`usage.prompt_tokens_details.cached_tokens` counts them). With `schema`, the name of a loaded
  schema, the messages import its modules instead (see pc_cpu.server.chat); with `documents`, ids
  or names of documents added with POST /v1/documents, one question (any system or developer
  messages, whose texts joined are the system message, then one user message) is answered by
  PromptCache.ask, and a longer conversation by PromptCache.chat, the documents placed before its
  first user message.
- `temperature` defaults to 0 (greedy, reproducible), not 1; `max_tokens` defaults to 256.
- Extensions: `top_k` (0: off), `use_cache` (false: full prefill of the same tokens, the baseline),
  `recompute` (cached module tokens to compute again, e.g. "tail:32" or "select:10%"; see
  pc_cpu.pml.recompute), with `documents` also `setting` ("fast" or "accurate", see
  pc_cpu.document_settings), `order` ("given", "relevant-first", "relevant-last") and `prefix` ("background",
  "first", "off": when the exact prefix is computed, see PromptCache.ask), and in answers `usage.cached_tokens`, `usage.uncached_tokens`, `usage.ttft_ms`, `usage.total_ms`
  and `tiers` (where each module's cells came from). `usage.prompt_tokens_details.cached_tokens`
  is OpenAI's own field for the cached count.
- `response_format` (json_object, json_schema) holds the answer to JSON by a grammar; `frequency_penalty`,
  `presence_penalty`, `logit_bias`, and llama.cpp's `repeat_penalty` and `min_p` are the sampler's; chat's
  `logprobs`/`top_logprobs` come with answers and with each streamed piece; /v1/completions takes the
  legacy integer `logprobs` (0..5) and answers in the legacy shape (tokens, token_logprobs, top_logprobs,
  text_offset).
- `tools`, `tool_choice` and `parallel_tool_calls` in conversations (PromptCache.chat), with assistant
  `tool_calls` and `tool` messages in the history; streamed calls come as one `tool_calls` delta per
  call, whole, after the text.
- `n` > 1: the choices are answered one after another, each reusing the prompt's cells the one before
  left (its last decode call computed again, so each answers as a full prefill would); not streamed.
- OpenAI fields this server does not implement (the legacy functions, best_of, ...) are
  refused with a 422 naming them, unless they ask for what it does anyway (n=1, logprobs=false,
  null): UNSUPPORTED lists them. IGNORED lists the few accepted and ignored on purpose (`model`:
  one model per server; `user`, `metadata`, ...: bookkeeping that does not change the answer).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pc_cpu.engine.llama.sampler import SEED_MAX, SamplingParams
from pc_cpu.errors import PromptCacheError
from pc_cpu.options import GenerationOptions
from pc_cpu.pml.chat import AFTER_EDIT
from pc_cpu.pml.document_layout import ENCODINGS, PREFIXES
from pc_cpu.pml.text import check_utf8
from pc_cpu.result import Result
from pc_cpu.pml.chat import ChatMessage
from pc_cpu.store.document_library import Document

DEFAULT_MAX_TOKENS = 256
MAX_CHOICES = 16  # n: each choice is an answer computed in turn


class RequestBody(BaseModel):
    """Base of every request body: a string UTF-8 cannot encode anywhere in it is a 422 naming where."""

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data):
        # Before the fields: a lone surrogate in an ignored field or a key is refused too, so no
        # message (a PML error quoting the text, say) can echo one into a response UTF-8 cannot encode.
        try:
            _check_json_text(data)
        except PromptCacheError as exc:
            raise ValueError(str(exc)) from None
        return data


def _check_json_text(body) -> None:
    """Raises PromptCacheError naming the first string of a parsed JSON body (keys too) that UTF-8 cannot encode.

    Fields are named as a client writes them: `messages[0].content[1].text`. A loop, not recursion:
    the body limit allows nesting deeper than Python's recursion limit.
    """
    pending = [("", body)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            check_utf8(value, where or "the body")
        elif isinstance(value, dict):
            for key in value:
                check_utf8(key, f"a key of {where or 'the body'}")
            pending += reversed([(f"{where}.{key}" if where else key, item) for key, item in value.items()])
        elif isinstance(value, list):
            pending += reversed([(f"{where}[{index}]", item) for index, item in enumerate(value)])


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """An OpenAI request field this server does not implement, and what to send instead."""

    name: str
    fix: str
    neutral: tuple = ()  # values asking for what the server does anyway (n=1, logprobs=false); null is one too

    def refuses(self, value: Any) -> bool:
        """Returns whether `value` asks for something this server would otherwise silently not do."""
        return value is not None and not any(_same_json(value, ok) for ok in self.neutral)


# The one place that refuses OpenAI fields: implementing one means adding it to the request model
# below and deleting its line here. Checked before the fields, so `n=2` is refused as unsupported,
# not validated as an int.
UNSUPPORTED = (
    Unsupported("best_of", "this server samples one answer; send best_of=1 or leave it out", (1,)),
    Unsupported("functions", "the legacy functions field is not taken; send them as `tools` (each "
                "{\"type\": \"function\", \"function\": {...}})", ([],)),
    Unsupported("function_call", "the legacy function_call field is not taken; send `tool_choice`",
                ("none", "auto")),
    Unsupported("echo", "this server does not echo the prompt; leave it out (or send false)", (False,)),
    Unsupported("suffix", "this server does not insert text before a suffix; leave it out", ("",)),
    Unsupported("modalities", "this server answers in text only; leave it out (or send [\"text\"])", (["text"],)),
    Unsupported("audio", "this server answers in text only; leave it out"),
    Unsupported("reasoning_effort", "this server's models do not take a reasoning effort; leave it out"),
    Unsupported("verbosity", "this server's models do not take a verbosity; leave it out", ("medium",)),
    Unsupported("web_search_options", "this server does not search the web; leave it out"),
    Unsupported("moderation", "this server runs no moderation; leave it out"),
)
# Accepted and ignored on purpose: none of them changes the answer.
IGNORED = (
    "model",  # one model per server
    "user", "metadata", "store", "service_tier", "safety_identifier",  # the client's bookkeeping
    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",  # this server caches by its own rules
    "prediction",  # a latency hint: the answer is the same without it
)


def unsupported_fields(body: Any) -> list[str]:
    """Returns one refusal per field of a parsed request body that asks for something UNSUPPORTED, in body order."""
    if not isinstance(body, dict):
        return []
    refused = {field.name: field for field in UNSUPPORTED if field.refuses(body.get(field.name))}
    return [f"{name}={_shown(body[name])}: {refused[name].fix}" for name in body if name in refused]


def _same_json(value: Any, expected: Any) -> bool:
    """Returns whether two parsed JSON values are equal as JSON: 1 == 1.0, but false is no 0."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        return not (isinstance(value, float) and math.isnan(value)) and value == expected
    if isinstance(value, list) and isinstance(expected, list):
        return len(value) == len(expected) and all(map(_same_json, value, expected))
    if isinstance(value, dict) and isinstance(expected, dict):
        return value.keys() == expected.keys() and all(_same_json(value[k], expected[k]) for k in value)
    return type(value) is type(expected) and value == expected


def _shown(value: Any, limit: int = 40) -> str:
    """Returns `value` as short JSON for a message; ASCII, so a lone surrogate in it is shown escaped, not sent."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


class SamplingRequest(RequestBody):
    """The fields both endpoints share."""

    # allow_inf_nan=False: a NaN or infinite temperature/top_p (Python's json reads `NaN`, `Infinity`)
    # is a 422 naming the field, not a sampler fed garbage.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    use_cache: bool = True
    recompute: Optional[str] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0  # llama.cpp's server's name; 1 is off
    min_p: float = 0.0  # likewise; 0 is off
    # {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}: the answer held to it by a
    # grammar; a schema the converter refuses is a 400 from PromptCache (pc_cpu.engine.llama.grammar).
    response_format: Optional[dict] = None
    logit_bias: Optional[dict[str, float]] = None  # {token id: bias}, as OpenAI sends it
    # {"include_usage": true}: a last chunk with no choices and the usage, as OpenAI sends it (the
    # chunk with finish_reason carries the usage too, always)
    stream_options: Optional[dict] = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # choices: answered one after another, sharing the prompt's cells

    @model_validator(mode="after")
    def _one_choice_streamed(self) -> "SamplingRequest":
        if self.n > 1 and self.stream:
            raise ValueError(f"n={self.n} with stream=true: choices are streamed one at a time only; send n=1 "
                             "(or leave out stream)")
        return self

    def choice_options(self) -> list[GenerationOptions]:
        """Returns each choice's options: the request's, its seed counted up from the first (n > 1)."""
        options = self.options()
        return [dataclasses.replace(options, seed=(options.seed + i) % (SEED_MAX + 1)) for i in range(self.n)]

    def include_usage(self) -> bool:
        """Returns whether a stream ends with OpenAI's usage-only chunk."""
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        refusals = unsupported_fields(data)
        if refusals:
            raise ValueError("; ".join(refusals))
        return data

    @model_validator(mode="after")
    def _sampling_in_range(self) -> "SamplingRequest":
        # The library's ranges, checked while the body is validated: a 422 like any other bad field.
        try:
            SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed or 0,
                           min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                           frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty).validate()
        except PromptCacheError as exc:
            raise ValueError(str(exc)) from None
        return self

    def options(self) -> GenerationOptions:
        """Returns the generation options of this request (pc_cpu.options)."""
        return GenerationOptions(max_tokens=self.max_tokens or DEFAULT_MAX_TOKENS, temperature=self.temperature,
                                 top_k=self.top_k, top_p=self.top_p, seed=self.seed or 0, stop=self.stop or (),
                                 use_cache=self.use_cache, recompute=self.recompute, min_p=self.min_p,
                                 repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                                 presence_penalty=self.presence_penalty, response_format=self.response_format,
                                 logit_bias=self.logit_bias)


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str]]
    # The legacy shape: an integer, the likeliest others at each token (0: the chosen token's alone), at most 5
    logprobs: Optional[int] = Field(None, ge=0, le=5)

    @model_validator(mode="before")
    @classmethod
    def _completion_fields(cls, data):
        if isinstance(data, dict):
            asked = [f"{name}={_shown(data[name])}" for name in ("tools", "tool_choice", "parallel_tool_calls")
                     if data.get(name) not in (None, [], "none")]
            if asked:
                raise ValueError(f"{', '.join(asked)}: tools are for conversations; send them to /v1/chat/completions")
            if data.get("logprobs") is True:  # not an int here, whatever Python says
                raise ValueError("logprobs=true: on /v1/completions logprobs is an integer (0..5: how many likeliest "
                                 "tokens to list at each token); null or false leaves them out")
            if data.get("logprobs") is False:
                data = {**data, "logprobs": None}
        return data

    def options(self) -> GenerationOptions:
        options = super().options()
        return options if self.logprobs is None else dataclasses.replace(options, logprobs=self.logprobs)

    def prompt_pml(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise PromptCacheError(f"prompt is a list of {len(self.prompt)} prompts; send one PML prompt")
        return self.prompt[0]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: Optional[str] = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: Union[str, list[TextPart], None] = None
    tool_calls: Optional[list[dict]] = None  # an assistant's: the calls its answer made, sent back as they came
    tool_call_id: Optional[str] = None  # a tool's: the call it answers
    name: Optional[str] = None

    def message(self, index: int) -> ChatMessage:
        """Returns the message with its content parts joined; only text parts are supported."""
        return ChatMessage(self.role, self.text(index))

    def text(self, index: int) -> str:
        """Returns the content's text, its parts joined; only text parts are supported."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise PromptCacheError(f"message {index} has a content part of type {part.type!r}; "
                                       "only text parts are supported")
        return "".join(part.text for part in self.content)

    def conversation(self, index: int) -> dict:
        """Returns the message as PromptCache.chat takes it (pc_cpu.pml.chat.check_messages checks the rest)."""
        message = {"role": self.role, "content": self.text(index)}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


SYSTEM_ROLES = ("system", "developer")


class ChatRequest(SamplingRequest):
    messages: list[ChatMessageIn] = Field(min_length=1)
    schema_name: Optional[str] = Field(None, alias="schema")
    documents: Optional[list[str]] = None  # ids or names: answer with PromptCache.ask instead of a schema
    setting: Optional[str] = None  # with documents: "fast" or "accurate" (pc_cpu.document_settings)
    order: Optional[str] = None  # with documents: "given", "relevant-first" or "relevant-last"
    prefix: Optional[str] = None  # with documents: "background" (None), "first" or "off" (pc_cpu.pml.document_layout)
    encoding: Optional[str] = None  # with documents: "library" or "preamble" (PromptCache.ask); None: the model's
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False  # each answer token's log probability, in choices[0].logprobs.content
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)  # with logprobs: the likeliest others at each token
    # a conversation: "recompute" or "reuse" the turns after an edited message (PromptCache.chat)
    after_edit: str = "recompute"
    tools: Optional[list[dict]] = None  # OpenAI's function tools (PromptCache.chat checks them)
    tool_choice: Union[str, dict, None] = None  # "auto", "none", "required" or {"type": "function", ...}
    parallel_tool_calls: Optional[bool] = None

    @model_validator(mode="after")
    def _logprobs_asked(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs={self.top_logprobs} needs logprobs=true, as OpenAI's API has it")
        return self

    @model_validator(mode="after")
    def _tools_in_conversations(self) -> "ChatRequest":
        if self.schema_name is not None and (self.tools or self.tool_choice not in (None, "none")):
            raise ValueError("`tools` are for conversations; a schema's prompt (`schema`) takes none: leave them out")
        return self

    def tool_arguments(self) -> dict:
        """Returns the tools, tool_choice and parallel_tool_calls as PromptCache.chat takes them."""
        return {"tools": self.tools, "tool_choice": self.tool_choice, "parallel_tool_calls": self.parallel_tool_calls}

    @model_validator(mode="after")
    def _schema_or_documents(self) -> "ChatRequest":
        if "after_edit" in self.model_fields_set:
            if self.after_edit not in AFTER_EDIT:
                raise ValueError(f"after_edit={self.after_edit!r}: use one of {', '.join(AFTER_EDIT)}")
            if self.schema_name is not None:
                raise ValueError("`after_edit` is for conversations; a schema's prompt reuses its modules: leave "
                                 "it out")
        if self.documents is None:
            if self.setting is not None or self.order is not None or self.prefix is not None or \
                    self.encoding is not None:
                raise ValueError("`setting`, `order`, `prefix` and `encoding` are for questions over `documents`; "
                                 "send `documents` too, or leave them out")
            return self  # a schema's prompt, or without one a plain conversation
        if self.schema_name is not None:
            raise ValueError("send `schema` or `documents`, not both: a question over documents uses no schema")
        if self.prefix is not None and self.prefix not in PREFIXES:
            raise ValueError(f"prefix={self.prefix!r}: use one of {', '.join(PREFIXES)}")
        if self.encoding is not None and self.encoding not in ENCODINGS:
            raise ValueError(f"encoding={self.encoding!r}: use one of {', '.join(ENCODINGS)}")
        if not self.is_question() and (self.setting or self.order or self.prefix or self.encoding):
            raise ValueError("`setting`, `order`, `prefix` and `encoding` are for one question over `documents` "
                             "(system messages, then one user message); a conversation over documents reuses its "
                             "turns: leave them out")
        return self

    def is_question(self) -> bool:
        """Returns whether the messages are one question (any system messages, then one user message) and no tools."""
        roles = [message.role for message in self.messages]
        return roles[-1] == "user" and all(role in SYSTEM_ROLES for role in roles[:-1]) and not self.tools

    def options(self) -> GenerationOptions:
        options = super().options()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            options = dataclasses.replace(options, max_tokens=self.max_completion_tokens)
        if self.logprobs:
            options = dataclasses.replace(options, logprobs=self.top_logprobs or 0)
        return options

    def conversation(self) -> list[dict]:
        """Returns the messages as OpenAI-style dicts with their text parts joined, for PromptCache.chat."""
        return [m.conversation(i) for i, m in enumerate(self.messages)]

    def question(self) -> tuple[str, str | None]:
        """Returns the question (the user message) and the system message (None without one), for documents."""
        messages = [m.message(i) for i, m in enumerate(self.messages)]
        system = [message.content.strip() for message in messages[:-1] if message.content.strip()]
        return messages[-1].content.strip(), "\n\n".join(system) if system else None


class SchemaRequest(RequestBody):
    pml: str


class DocumentRequest(RequestBody):
    text: str
    name: Optional[str] = Field(None, min_length=1)  # an alias of the id; DELETE and `documents` accept it
    system: Optional[str] = None  # encode for this system message now (asking with another encodes on first use)
    # (stripped, and empty is none, as chat's system messages are: the same text then finds the same encodings)


# --- answers ----------------------------------------------------------------


def new_id(kind: Literal["cmpl", "chatcmpl"]) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def usage(result: Result, *more: Result) -> dict:
    """Returns OpenAI's usage object with the cache counts and timings (ms) added (of the first choice; tokens of all)."""
    completion = sum(len(r.token_ids) for r in (result, *more))
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "cached_tokens": result.cached_tokens, "uncached_tokens": result.uncached_tokens,
            "ttft_ms": round(result.ttft_ms, 3), "total_ms": round(result.total_ms, 3)}


def completion_json(id_: str, model: str, result: Result, *more: Result) -> dict:
    """Returns a completion's JSON; `more`: the other choices' Results (n > 1)."""
    return {"id": id_, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": r.text, "finish_reason": r.finish_reason,
                         "logprobs": None if r.logprobs is None else legacy_logprobs(r.logprobs)}
                        for i, r in enumerate((result, *more))],
            "usage": usage(result, *more), "tiers": result.tiers}


def legacy_logprobs(logprobs, offset: int = 0) -> dict:
    """Returns the completions API's `logprobs` object of Result.logprobs items: tokens, their log probabilities,
    the likeliest others ({token: logprob}) and each token's offset in the text (from `offset`)."""
    text = lambda item: bytes(item["bytes"]).decode("utf-8", errors="replace")
    offsets, at = [], offset
    for item in logprobs:
        offsets.append(at)
        at += len(text(item))
    return {"tokens": [text(item) for item in logprobs], "token_logprobs": [item["logprob"] for item in logprobs],
            "top_logprobs": [{text(top): top["logprob"] for top in item["top"]} for item in logprobs],
            "text_offset": offsets}


def completion_chunk(id_: str, model: str, text: str, result: Result | None = None, logprobs=(),
                     offset: int = 0) -> dict:
    """Returns one streamed piece (with its tokens' logprobs when asked); the last chunk (result given) carries
    finish_reason, usage and tiers."""
    chunk = {"id": id_, "object": "text_completion", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "text": text, "finish_reason": result and result.finish_reason,
                          "logprobs": legacy_logprobs(logprobs, offset) if logprobs else None}]}
    if result is not None:
        chunk.update(usage=usage(result), tiers=result.tiers)
    return chunk


def usage_chunk(id_: str, model: str, result: Result, *, chat: bool) -> dict:
    """Returns the chunk stream_options.include_usage asks for: no choices, the usage."""
    return {"id": id_, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [], "usage": usage(result)}


def chat_json(id_: str, model: str, result: Result, *more: Result) -> dict:
    """Returns a chat answer's JSON; `more`: the other choices' Results (n > 1)."""
    return {"id": id_, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": _message(r), "finish_reason": r.finish_reason,
                         "logprobs": chat_logprobs(r)} for i, r in enumerate((result, *more))],
            "usage": usage(result, *more), "tiers": result.tiers}


def _message(result: Result) -> dict:
    if result.tool_calls:
        return {"role": "assistant", "content": result.text or None, "tool_calls": result.tool_calls}
    return {"role": "assistant", "content": result.text}


def tool_call_chunks(id_: str, model: str, result: Result) -> list[dict]:
    """Returns the streamed deltas of an answer's tool calls, one chunk a call (sent before the finishing chunk)."""
    return [chat_chunk(id_, model, {"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(result.tool_calls or ())]


def chat_logprobs(result: Result) -> dict | None:
    """Returns OpenAI's `logprobs` of a chat answer ({"content": [one per token]}), or None when not asked for."""
    return None if result.logprobs is None else logprobs_content(result.logprobs)


def logprobs_content(logprobs) -> dict:
    """Returns OpenAI's chat `logprobs` object of Result.logprobs items (or a streamed piece's)."""

    def entry(item: dict) -> dict:
        raw = bytes(item["bytes"])
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": item["logprob"], "bytes": item["bytes"]}

    return {"content": [entry(item) | {"top_logprobs": [entry(top) for top in item["top"]]}
                        for item in logprobs], "refusal": None}


def chat_chunk(id_: str, model: str, delta: dict, result: Result | None = None, logprobs=()) -> dict:
    """Returns one streamed delta (with its tokens' logprobs when asked); the last chunk (result given) carries
    finish_reason, usage and tiers."""
    chunk = {"id": id_, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": result and result.finish_reason,
                          "logprobs": logprobs_content(logprobs) if logprobs else None}]}
    if result is not None:
        chunk.update(usage=usage(result), tiers=result.tiers)
    return chunk


PREVIEW_CHARS = 80


def document_json(doc: Document, tokens: int) -> dict:
    """Returns a document as the API lists it: no full text, a one-line preview of its start."""
    flat = " ".join(doc.text.split())
    preview = flat if len(flat) <= PREVIEW_CHARS else flat[:PREVIEW_CHARS - 1] + "\u2026"
    return {"id": doc.id, "object": "document", "names": list(doc.names), "tokens": tokens,
            "chars": len(doc.text), "added": int(doc.added), "preview": preview}


def error_json(message: str, type_: str) -> dict:
    return {"error": {"message": message, "type": type_}}
