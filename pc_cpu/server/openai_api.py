"""Gives the OpenAI-style wire shapes of the server: request bodies and the JSON of answers and chunks.

Differences from OpenAI, on purpose:
- `prompt` (completions) is a PML `<prompt schema="...">` document; chat needs `schema`, the name
  of a loaded schema whose modules the messages import (see pc_cpu.server.chat).
- `temperature` defaults to 0 (greedy, reproducible), not 1; `max_tokens` defaults to 256.
- Extensions: `top_k` (0: off), `use_cache` (false: full prefill of the same tokens, the baseline),
  `recompute` (cached module tokens to compute again, e.g. "tail:32" or "select:10%"; see
  pc_cpu.pml.recompute), and in answers `usage.cached_tokens`, `usage.uncached_tokens`, `usage.ttft_ms`, `usage.total_ms`
  and `tiers` (where each module's cells came from). `usage.prompt_tokens_details.cached_tokens`
  is OpenAI's own field for the cached count.
- `model` is accepted and ignored (one model per server); `n` must be 1; other OpenAI fields
  (logprobs, presence_penalty, ...) are ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pc_cpu.errors import PromptCacheError
from pc_cpu.result import Result
from pc_cpu.server.chat import Message

DEFAULT_MAX_TOKENS = 256


class SamplingRequest(BaseModel):
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

    def options(self) -> dict:
        """Returns the keyword arguments of PromptCache.stream for this request."""
        if self.n != 1:
            raise PromptCacheError(f"n={self.n}: this server returns one choice; send n=1")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return {"max_tokens": self.max_tokens or DEFAULT_MAX_TOKENS, "temperature": self.temperature,
                "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed or 0, "stop": stop,
                "use_cache": self.use_cache, "recompute": self.recompute}


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


class ChatRequest(SamplingRequest):
    messages: list[ChatMessageIn] = Field(min_length=1)
    schema_name: str = Field(alias="schema")
    max_completion_tokens: Optional[int] = Field(None, ge=1)

    def options(self) -> dict:
        options = super().options()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            options["max_tokens"] = self.max_completion_tokens
        return options


class SchemaRequest(BaseModel):
    pml: str


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


def error_json(message: str, type_: str) -> dict:
    return {"error": {"message": message, "type": type_}}
