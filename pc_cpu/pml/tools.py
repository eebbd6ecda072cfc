"""Gives a conversation's tools as OpenAI sends them, and the tool calls in a model's answer.

    tools = check_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}])
    choice = check_tool_choice("required", tools)
    content, calls = parse_tool_calls('<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>')
    calls[0].openai()   # {"id": "call_...", "type": "function", "function": {"name": ..., "arguments": "{...}"}}

One format of calls: each a JSON object {"name": ..., "arguments": {...}} between <tool_call> and
</tool_call> (the Hermes format, Qwen2.5's). A model whose chat template takes `tools` (it renders
them and the calls in its history itself) is prompted by it; another gets the tools described in
its system message in the same format (`tools_system_text`), as llama.cpp's server does for a
template without tool support. Which calls an answer may hold is the sampler's job: a grammar
(pc_cpu.engine.llama.grammar.tool_call_grammar) for `required` or a named function, the same
grammar applied lazily once the model opens a call under `auto`, so a call always parses.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from pc_cpu.errors import PromptError

OPEN, CLOSE = "<tool_call>", "</tool_call>"  # around each call the model makes
CHOICES = ("auto", "none", "required")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's function names (and a dot, which some clients use)
_CALL = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


@dataclass(frozen=True)
class ToolChoice:
    """Which calls an answer may make: mode "auto" (any or none), "none", "required" (at least one) or "function"."""

    mode: str = "auto"
    name: str | None = None  # with mode "function": the one function the answer calls


@dataclass(frozen=True)
class ToolCall:
    """One call in an answer: a function's name and its arguments (parsed JSON, usually an object)."""

    name: str
    arguments: Any
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict:
        """Returns the call in OpenAI's shape, its arguments as JSON text."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}

    def template(self) -> dict:
        """Returns the call as chat templates read it: arguments an object, not text (llama.cpp's server does the same)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def check_tools(tools: Any) -> tuple[dict, ...]:
    """Returns OpenAI-style tools as they are rendered ({"type": "function", "function": {...}}); raises PromptError naming a fault.

    A function needs a name; `parameters`, when given, must be a JSON schema object (its grammar
    is made by the sampler: a schema it cannot follow is refused there).
    """
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise PromptError(f"tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}}, not "
                          f"{type(tools).__name__}")
    checked, names = [], set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or \
                not isinstance(function, Mapping):
            raise PromptError(f"tools[{i}] is not a function tool; send {{\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"parameters\": {...}}}")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise PromptError(f"tools[{i}].function.name={name!r}: give 1 to 64 letters, digits, '_', '-' or '.'")
        if name in names:
            raise PromptError(f"tools[{i}]: a second function named {name!r}; give each function its own name")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise PromptError(f"tools[{i}].function.parameters must be a JSON schema object, e.g. "
                              '{"type": "object", "properties": {...}}')
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise PromptError(f"tools[{i}].function.description must be a string")
        checked.append({"type": "function", "function": dict(function)})
    return tuple(checked)


def check_tool_choice(choice: Any, tools: Sequence[dict], *, parallel: bool | None = None) -> ToolChoice:
    """Returns the ToolChoice of OpenAI's `tool_choice` (None: auto with tools, none without); raises PromptError naming a fault."""
    if parallel is not None and not isinstance(parallel, bool):
        raise PromptError(f"parallel_tool_calls={parallel!r}: send true or false")
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise PromptError(f"tool_choice={choice!r}: use one of {', '.join(CHOICES)}, or "
                              '{"type": "function", "function": {"name": ...}}')
        if choice != "none" and not tools:
            raise PromptError(f"tool_choice={choice!r} needs tools; send `tools` too, or leave tool_choice out")
        return ToolChoice(choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, Mapping) and \
        isinstance(choice.get("function"), Mapping) else None
    if not isinstance(name, str):
        raise PromptError('tool_choice must be "auto", "none", "required" or {"type": "function", "function": '
                          '{"name": ...}}')
    known = [tool["function"]["name"] for tool in tools]
    if name not in known:
        raise PromptError(f"tool_choice names the function {name!r}, which is not among the tools "
                          f"({', '.join(known) or 'none sent'}); name one of them")
    return ToolChoice("function", name)


def parse_tool_calls(text: str, names: Collection[str] = ()) -> tuple[str, tuple[ToolCall, ...]]:
    """Returns an answer's text without its calls (stripped) and the calls, in order.

    A call whose JSON does not parse, or has no name, stays in the text: the client sees what the
    model wrote rather than losing it. A call cut short (max_tokens, a stop text) before its
    closing tag is read if its JSON is whole. `names`: the tools' names; an answer without tags
    that is nothing but a call to one of them, as JSON (in a ``` fence or not), is read as that
    call too: small models write calls so (Qwen2.5-Coder-0.5B does), and llama.cpp reads them.
    """
    if OPEN not in text and names:
        calls = _bare_calls(text, names)
        if calls:
            return "", calls
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _CALL.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue
        kept.append(text[position:match.start()])
        calls.append(call)
        position = match.end()
    kept.append(text[position:])
    content = "".join(kept)
    return (content.strip() if calls else content), tuple(calls)


def _bare_calls(text: str, names: Collection[str]) -> tuple[ToolCall, ...]:
    """Returns the calls an answer is when it is only JSON naming known tools (a fence around it allowed), else ()."""
    body = _FENCE.sub(r"\1", text.strip()).strip()
    if not body.startswith(("{", "[")):
        return ()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return ()
    items = value if isinstance(value, list) else [value]
    calls = [_call(json.dumps(item)) if isinstance(item, dict) else None for item in items]
    if not calls or any(call is None or call.name not in names for call in calls):
        return ()
    if any(not {"arguments", "parameters"} & item.keys() for item in items):
        return ()  # an object that only happens to have a "name": an answer, not a call
    return tuple(calls)


def could_be_bare_call(text: str) -> bool:
    """Returns whether an answer begun with `text` may yet turn out to be a bare JSON call (so it is held back)."""
    start = text.lstrip()
    return not start or start.startswith(("{", "[", "```")) or "```".startswith(start)


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text, as OpenAI sends them
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return ToolCall(value["name"], arguments)


def calls_text(calls: Sequence[ToolCall]) -> str:
    """Returns calls as a model writes them in this format, one after another."""
    return "\n".join(f"{OPEN}\n" + json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
                     + f"\n{CLOSE}" for call in calls)


def history_calls(tool_calls: Any, index: int) -> tuple[ToolCall, ...]:
    """Returns an assistant message's `tool_calls` (OpenAI's shape, arguments as JSON text) as ToolCalls; PromptError naming a fault."""
    if tool_calls is None:
        return ()
    if isinstance(tool_calls, (str, bytes)) or not isinstance(tool_calls, Sequence):
        raise PromptError(f"message {index}'s tool_calls must be a list of calls")
    calls = []
    for j, call in enumerate(tool_calls):
        if isinstance(call, ToolCall):
            calls.append(call)
            continue
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise PromptError(f"message {index}'s tool_calls[{j}] needs function.name and function.arguments, as "
                              "the answer gave them")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise PromptError(f"message {index}'s tool_calls[{j}].function.arguments is not JSON; send it back "
                                  "as the answer gave it") from None
        calls.append(ToolCall(function["name"], arguments, str(call.get("id") or "")))
    return tuple(calls)


def tools_system_text(tools: Sequence[dict]) -> str:
    """Returns the tools described for a model whose template does not take them: Qwen2.5's words, its format."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            f"within {OPEN}{CLOSE} XML tags:\n{OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}"
            f"\n{CLOSE}")


def call_schema(tools: Sequence[dict], choice: ToolChoice) -> dict:
    """Returns the JSON schema of one call the choice allows: {"name": one of the tools, "arguments": its parameters}."""
    chosen = [tool["function"] for tool in tools if choice.mode != "function" or tool["function"]["name"] == choice.name]
    options = [{"type": "object",
                "properties": {"name": {"const": function["name"]},
                               "arguments": function.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"]} for function in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}
