"""Registers pc_cpu's packaged models as models of simonw/llm: `llm -m pc-cpu-smollm2-135m "Hello"`.

    llm -m pc-cpu-qwen2.5-coder-0.5b -f notes.md -f spec.md "What does the spec ask of the notes?"
    llm chat -m pc-cpu-smollm2-135m

llm loads this module through the entry point in pyproject.toml ([project.entry-points.llm]).
pc_cpu never imports it, so pc_cpu works without llm installed; llm is imported here only.

Each fragment (`-f`) is a document of the store, encoded once (PromptCache.add_document), and a
prompt with fragments is a question over them (PromptCache.stream_ask): a later prompt over the
same files restores their cells and computes only its question. Any other prompt, and every turn
of a conversation after the first, goes to PromptCache.stream_chat, which reuses the cells of the
conversation's earlier turns (and places the first turn's fragments as documents).
"""

from __future__ import annotations

import atexit
import json
import threading
from typing import TYPE_CHECKING, Iterator, Literal

import llm
from llm.parts import TextPart, ToolCallPart, ToolResultPart
from pydantic import Field

from pc_cpu.errors import DocumentError, PromptCacheError
from pc_cpu.models import MODELS
from pc_cpu.store.document_library import MAX_NAMES_PER_DOCUMENT, check_name

if TYPE_CHECKING:
    from pc_cpu.cache import PromptCache

MODEL_ID_PREFIX = "pc-cpu-"

# One PromptCache per model, opened by the first prompt and kept for the process: reopening would
# load the model again and drop the conversations held in its prompt slots.
_caches: dict[str, tuple["PromptCache", int | None]] = {}  # model name -> (cache, threads it was opened with)
_caches_lock = threading.Lock()


@llm.hookimpl
def register_models(register):
    """Returns None after registering one llm model per packaged model (pc_cpu.models), installed or not."""
    for name in MODELS:
        register(PromptCacheModel(name))


def prompt_cache(name: str, threads: int | None = None) -> "PromptCache":
    """Returns this process's PromptCache of packaged model `name`, opening it on first use.

    Raises:
        llm.ModelError: `threads` differs from the threads the cache was opened with.
        PromptCacheError: the model is not installed or cannot be loaded.
    """
    # One lock for every model: opening takes seconds, and two threads must not load one model twice.
    with _caches_lock:
        if name not in _caches:
            from pc_cpu.cache import PromptCache  # imported late: every `llm` command loads this plugin

            _caches[name] = (PromptCache(name, threads=threads), threads)
        cache, opened_with = _caches[name]
    if threads is not None and threads != opened_with:
        raise llm.ModelError(f"{MODEL_ID_PREFIX}{name} is already open in this process with threads={opened_with}; "
                             "threads applies when a model is opened: leave the option out, or call "
                             "pc_cpu.llm_plugin.close_all() first")
    return cache


def close_all(*, wait: bool = False) -> None:
    """Returns None after closing every PromptCache this module opened; the next prompt opens its model again.

    wait: first let each finish its background work (pc_cpu.cache.PromptCache.wait_idle).
    """
    with _caches_lock:
        caches = [cache for cache, _ in _caches.values()]
        _caches.clear()
    for cache in caches:
        if wait:
            cache.wait_idle()
        cache.close()


@atexit.register
def _at_exit() -> None:
    # Each `llm` command is a process of its own: what the next one reuses (the exact prefix of a
    # question's fragments, a conversation's turn for `llm -c`) is stored only once the scheduler is
    # idle, so wait for it, as `pc-cpu ask` does. Ctrl-C skips the wait; the stores keep what was done.
    try:
        close_all(wait=True)
    except KeyboardInterrupt:
        pass


class PromptCacheModel(llm.Model):
    """A packaged model of pc_cpu (pc_cpu.models), answered through a PromptCache."""

    can_stream = True
    supports_schema = True  # `llm --schema`: the answer is held to the schema by a grammar (response_format)
    supports_tools = True  # `llm --tool` / `--functions`: PromptCache.chat's tools, the calls handed to llm to run

    class Options(llm.Options):
        max_tokens: int = Field(256, ge=1, description="Most tokens to generate")
        temperature: float = Field(0.0, ge=0, allow_inf_nan=False, description="Sampling temperature; 0 is greedy")
        top_k: int | None = Field(None, ge=0, description="Sample among the k likeliest tokens (0: off)")
        top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                                    description="Sample among the likeliest tokens of this total probability (1: off)")
        seed: int | None = Field(None, ge=0, description="Seed of the sampler")
        setting: Literal["fast", "accurate"] | None = Field(
            None, description="With fragments: fast (default) assembles them from their cached cells; accurate "
                              "answers as a full prefill would (the first question over them is as slow as one)")
        threads: int | None = Field(None, ge=1, description="CPU threads; applies when the model is first opened")
        tool_choice: Literal["auto", "required", "none"] | None = Field(
            None, description="With tools: auto (default) lets the model choose, required makes it call one, none "
                              "keeps it from calling")

    def __init__(self, name: str):
        self.name = name  # the packaged model's name, e.g. "smollm2-135m"
        self.model_id = MODEL_ID_PREFIX + name

    def execute(self, prompt, stream, response, conversation) -> Iterator[str]:
        """Returns an iterator of the answer's text: its pieces when streaming, else the whole text at once."""
        options = prompt.options
        generation = {key: getattr(options, key) for key in ("max_tokens", "temperature", "top_k", "top_p", "seed")
                      if getattr(options, key) is not None}
        if prompt.schema:  # llm gives the schema as a dict (it turns its concise forms into one first)
            generation["response_format"] = {"type": "json_schema", "json_schema": {"name": "llm", "schema": prompt.schema}}
        # prompt.messages is the whole conversation llm sends: `llm -c` loads earlier turns into it,
        # not into conversation.responses.
        messages = _messages(prompt)
        details: dict = {}
        try:
            pc = prompt_cache(self.name, options.threads)
            if _question_over_fragments(prompt) and not any(m["role"] == "assistant" for m in messages):
                system = prompt.system or None
                ids = [_add_fragment(pc, fragment, system) for fragment in prompt.fragments]
                details["documents"] = ids
                pieces = pc.stream_ask(_question(prompt), documents=ids, system=system, setting=options.setting,
                                       **generation)
            else:
                documents = _first_turn_documents(pc, messages, conversation)
                if documents:
                    details["documents"] = documents
                tools = _tools(prompt)
                if tools:
                    generation.update(tools=tools, tool_choice=options.tool_choice)
                pieces = pc.stream_chat(messages, **generation, **({"documents": documents} if documents else {}))
            try:
                if stream:
                    yield from pieces
                else:
                    yield "".join(pieces)
            finally:
                pieces.close()  # a caller that stopped reading cancels the rest of the answer
        except PromptCacheError as exc:
            raise llm.ModelError(str(exc)) from exc
        for call in pieces.result.tool_calls or ():  # llm runs them, then sends their results as the next prompt
            response.add_tool_call(llm.ToolCall(name=call["function"]["name"],
                                                arguments=json.loads(call["function"]["arguments"]),
                                                tool_call_id=call["id"]))
        _record(response, pieces.result, details)


def _tools(prompt) -> list[dict]:
    """Returns the prompt's llm Tools as OpenAI-style function tools (PromptCache.chat's `tools`)."""
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                              "parameters": tool.input_schema or {"type": "object"}}}
            for tool in getattr(prompt, "tools", None) or ()]


def _messages(prompt) -> list[dict]:
    """Returns the conversation llm sends for `prompt` (earlier turns, then this one) as OpenAI-style messages.

    Each user message holds its turn's fragments and text, as llm joined them. An assistant's tool
    calls become its `tool_calls`; each tool result a message of the tool role.
    """
    messages = []
    for message in prompt.messages:
        text = "".join(part.text for part in message.parts if isinstance(part, TextPart))
        results = [part for part in message.parts if isinstance(part, ToolResultPart)]
        calls = [part for part in message.parts if isinstance(part, ToolCallPart)]
        if results:
            messages += [{"role": "tool", "tool_call_id": part.tool_call_id, "name": part.name,
                          "content": part.output if part.exception is None else f"Error: {part.exception}"}
                         for part in results]
            if text:
                messages.append({"role": "user", "content": text})
            continue
        entry = {"role": message.role, "content": text}
        if calls:
            entry["tool_calls"] = [{"id": part.tool_call_id or f"call_{i}", "type": "function",
                                    "function": {"name": part.name, "arguments": json.dumps(part.arguments)}}
                                   for i, part in enumerate(calls)]
        messages.append(entry)
    return messages


def _first_turn_documents(pc: "PromptCache", messages: list[dict], conversation) -> list[str] | None:
    """Returns the ids of the first turn's fragments after taking their text out of `messages`, or None to leave it in.

    In a conversation whose first turn was a question over fragments, those fragments stay
    documents for every later turn: stream_chat places them before the first user message,
    restored from their cells. Fragments given in a later turn stay text in its user message,
    and so do the first turn's when they are not known (a conversation `llm -c` read back from
    the logs keeps only the joined text).
    """
    responses = conversation.responses if conversation is not None else []
    if not responses or not _question_over_fragments(responses[0].prompt):
        return None
    first = responses[0].prompt
    user = next((m for m in messages if m["role"] == "user"), None)
    if user is None or user["content"] != first.prompt:  # not the turn those fragments came with
        return None
    user["content"] = _question(first)
    return [_add_fragment(pc, fragment, first.system or None) for fragment in first.fragments]


def _question(prompt) -> str:
    """Returns the prompt's own text, without its fragments ("" when it has none)."""
    # prompt.prompt is the fragments and the text joined by newlines, and llm offers no way to
    # leave fragments out of it: the text alone is the (private) prompt._prompt.
    return prompt._prompt or ""


def _question_over_fragments(prompt) -> bool:
    """Returns whether a prompt is a question over its fragments: it has both (fragments alone are the prompt)."""
    return bool(prompt.fragments) and bool(_question(prompt).strip())


def _add_fragment(pc: "PromptCache", fragment, system: str | None) -> str:
    """Returns the document id of a fragment's text, adding (and encoding) it the first time."""
    text = str(fragment)
    return pc.add_document(text, name=_document_name(pc, text, getattr(fragment, "source", "")), system=system)


def _document_name(pc: "PromptCache", text: str, source: str) -> str | None:
    """Returns the name to add `text` under: the fragment's source (its path or URL), or None when it cannot name it.

    The library refuses a name that already names other text, so a file edited since it was
    added (or `-f -` with new input) is added without a name rather than refused: the document's
    id, a hash of its text, is what the question uses.
    """
    if not source:  # a plain string from Python's API: no source to name it by
        return None
    try:
        check_name(source)
    except DocumentError:  # a URL too long for a name, say
        return None
    documents = pc.list_documents()
    if any(source in doc.names and doc.text != text for doc in documents):
        return None
    same = next((doc for doc in documents if doc.text == text), None)
    if same is not None and source not in same.names and len(same.names) >= MAX_NAMES_PER_DOCUMENT:
        return None
    return source


def _record(response, result, details: dict) -> None:
    """Returns None after putting the Result's token counts and timings on llm's response (`llm logs --json`)."""
    response.set_usage(input=result.prompt_tokens, output=len(result.token_ids),
                       details={"cached_tokens": result.cached_tokens})
    response.response_json = {
        **details,
        "cached_tokens": result.cached_tokens,
        "uncached_tokens": result.uncached_tokens,
        "ttft_ms": round(result.ttft_ms, 1),
        "total_ms": round(result.total_ms, 1),
        "finish_reason": result.finish_reason,
        "tiers": {key: str(tier) for key, tier in result.tiers.items()},
    }
