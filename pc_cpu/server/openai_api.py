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
- `model` is accepted and ignored (one model per server); `n` must be 1; other OpenAI fields
  (logprobs, presence_penalty, ...) are ignored.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pc_cpu.engine.sampler import SamplingParams
from pc_cpu.errors import PromptCacheError
from pc_cpu.options import GenerationOptions
from pc_cpu.pml.chat import AFTER_EDIT
from pc_cpu.pml.document_layout import ENCODINGS, PREFIXES
from pc_cpu.pml.text import check_utf8
from pc_cpu.result import Result
from pc_cpu.server.chat import Message
from pc_cpu.store.document_library import Document

DEFAULT_MAX_TOKENS = 256


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
    n: int = 1
    use_cache: bool = True
    recompute: Optional[str] = None

    @model_validator(mode="after")
    def _sampling_in_range(self) -> "SamplingRequest":
        # The library's ranges, checked while the body is validated: a 422 like any other bad field.
        try:
            SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                           seed=self.seed or 0).validate()
        except PromptCacheError as exc:
            raise ValueError(str(exc)) from None
        return self

    def options(self) -> GenerationOptions:
        """Returns the generation options of this request (pc_cpu.options)."""
        if self.n != 1:
            raise PromptCacheError(f"n={self.n}: this server returns one choice; send n=1")
        return GenerationOptions(max_tokens=self.max_tokens or DEFAULT_MAX_TOKENS, temperature=self.temperature,
                                 top_k=self.top_k, top_p=self.top_p, seed=self.seed or 0, stop=self.stop or (),
                                 use_cache=self.use_cache, recompute=self.recompute)


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str]]

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

    def message(self, index: int) -> Message:
        """Returns the message with its content parts joined; only text parts are supported."""
        if self.content is None or isinstance(self.content, str):
            return Message(self.role, self.content or "")
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise PromptCacheError(f"message {index} has a content part of type {part.type!r}; "
                                       "only text parts are supported")
        return Message(self.role, "".join(part.text for part in self.content))


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
    # a conversation: "recompute" or "reuse" the turns after an edited message (PromptCache.chat)
    after_edit: str = "recompute"

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
        """Returns whether the messages are one question (any system messages, then one user message)."""
        roles = [message.role for message in self.messages]
        return roles[-1] == "user" and all(role in SYSTEM_ROLES for role in roles[:-1])

    def options(self) -> GenerationOptions:
        options = super().options()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            options = dataclasses.replace(options, max_tokens=self.max_completion_tokens)
        return options

    def conversation(self) -> list[dict]:
        """Returns the messages as OpenAI-style dicts with their text parts joined, for PromptCache.chat."""
        return [{"role": m.role, "content": m.message(i).text} for i, m in enumerate(self.messages)]

    def question(self) -> tuple[str, str | None]:
        """Returns the question (the user message) and the system message (None without one), for documents."""
        messages = [m.message(i) for i, m in enumerate(self.messages)]
        system = [message.text.strip() for message in messages[:-1] if message.text.strip()]
        return messages[-1].text.strip(), "\n\n".join(system) if system else None


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


def usage(result: Result) -> dict:
    """Returns OpenAI's usage object with the cache counts and timings (ms) added."""
    completion = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "cached_tokens": result.cached_tokens, "uncached_tokens": result.uncached_tokens,
            "ttft_ms": round(result.ttft_ms, 3), "total_ms": round(result.total_ms, 3)}


def completion_json(id_: str, model: str, result: Result) -> dict:
    return {"id": id_, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": result.text, "finish_reason": result.finish_reason,
                         "logprobs": None}],
            "usage": usage(result), "tiers": result.tiers}


def completion_chunk(id_: str, model: str, text: str, result: Result | None = None) -> dict:
    """Returns one streamed piece; the last chunk (result given) carries finish_reason, usage and tiers."""
    chunk = {"id": id_, "object": "text_completion", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "text": text, "finish_reason": result and result.finish_reason,
                          "logprobs": None}]}
    if result is not None:
        chunk.update(usage=usage(result), tiers=result.tiers)
    return chunk


def chat_json(id_: str, model: str, result: Result) -> dict:
    return {"id": id_, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                         "finish_reason": result.finish_reason, "logprobs": None}],
            "usage": usage(result), "tiers": result.tiers}


def chat_chunk(id_: str, model: str, delta: dict, result: Result | None = None) -> dict:
    """Returns one streamed delta; the last chunk (result given) carries finish_reason, usage and tiers."""
    chunk = {"id": id_, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": result and result.finish_reason,
                          "logprobs": None}]}
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
