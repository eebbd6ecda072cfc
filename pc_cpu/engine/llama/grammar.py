"""Gives the GBNF grammar an answer is held to: JSON, or JSON that a schema admits (OpenAI's `response_format`).

The JSON-schema-to-GBNF converter is the one llama-cpp-python ships (llama_cpp.llama_grammar, a
port of llama.cpp's json_schema_to_grammar), and llama.cpp's grammar sampler applies the grammar
(pc_cpu.engine.llama.sampler): nothing here parses JSON or samples. Whitespace between tokens is
bounded by the converter (`space ::= " "?`), so a constrained answer cannot spin on blanks.

What a grammar cannot promise: an answer cut at max_tokens stops wherever it is, a prefix of valid
JSON (Result.finish_reason "length"); raise max_tokens, or bound the schema (maxLength, maxItems).
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from llama_cpp.llama_grammar import json_schema_to_gbnf

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.tools import CLOSE, OPEN, ToolChoice, call_schema

TYPES = ("text", "json_object", "json_schema")
_ANY_OBJECT = {"type": "object"}  # what json_object asks for: a JSON object, as llama.cpp's server reads it


def response_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """Returns the GBNF grammar of an OpenAI `response_format`, or None for free text.

    Accepted: None or {"type": "text"} (free text), {"type": "json_object"} (any JSON object), and
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}.

    Raises:
        PromptCacheError: a response_format of another shape, or a schema the converter refuses,
            naming what is wrong.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise PromptCacheError(f"response_format must be an object such as {{\"type\": \"json_object\"}}, "
                               f"not {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind not in TYPES:
        raise PromptCacheError(f"response_format.type={kind!r}: use one of {', '.join(TYPES)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_grammar(response_format.get("schema") or _ANY_OBJECT)  # llama.cpp also takes a schema here
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping) or "schema" not in spec:
        raise PromptCacheError('response_format.json_schema must be an object with a "schema" (and a "name"), '
                               'e.g. {"name": "answer", "schema": {"type": "object", ...}}')
    return schema_grammar(spec["schema"])


def schema_grammar(schema: Any) -> str:
    """Returns the GBNF grammar of a JSON schema (a dict, or its JSON text); raises PromptCacheError naming its fault."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise PromptCacheError(f"the JSON schema is not JSON ({exc}); give a JSON object") from None
    if not isinstance(schema, Mapping):
        raise PromptCacheError(f"a JSON schema must be an object, not {type(schema).__name__}")
    try:
        return _strict_strings(json_schema_to_gbnf(json.dumps(schema)))
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        # The converter asserts what it cannot follow: an unknown type, an unresolved $ref, a bad pattern.
        raise PromptCacheError(f"the JSON schema cannot constrain an answer: {exc or type(exc).__name__}; "
                               "fix it (pc_cpu accepts what llama.cpp's json_schema_to_grammar does)") from None


# The converter's string characters admit raw control characters (a newline inside a string), which JSON
# forbids: an answer held to it could fail to parse. llama.cpp's own converter excludes them, as here.
_LOOSE_CHAR = 'char ::= [^"\\\\]'
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F]'


def _strict_strings(gbnf: str) -> str:
    """Returns the converter's grammar with JSON's rule for string characters: no raw control characters."""
    return gbnf.replace(_LOOSE_CHAR, _STRICT_CHAR)


_ROOT = re.compile(r"(?<![\w-])root(?![\w-])")


def tool_call_grammar(tools: Sequence[dict], choice: ToolChoice, *, parallel: bool = True) -> str:
    """Returns the GBNF of an answer that is calls only: each <tool_call>{"name": ..., "arguments": ...}</tool_call>.

    The names are the tools' (the named one's with tool_choice naming a function), the arguments
    held to each function's `parameters` schema; more than one call when `parallel`. Applied from
    the start (tool_choice "required" or a named function), or lazily from the model's first
    <tool_call> under "auto" (SamplingParams.grammar_triggers), so a call always parses.

    Raises:
        PromptCacheError: a function's parameters schema the converter refuses, naming the function.
    """
    try:
        call = schema_grammar(call_schema(tools, choice))
    except PromptCacheError as exc:
        raise PromptCacheError(f"tools: {exc}") from None
    call = _ROOT.sub("tool-call-json", call)  # the converter's root becomes one call's JSON
    more = ' ( "\\n" tool-call )*' if parallel else ""
    return (f"root ::= tool-call{more}\n"
            f"tool-call ::= {json.dumps(OPEN)} \"\\n\" tool-call-json \"\\n\" {json.dumps(CLOSE)}\n{call}")
