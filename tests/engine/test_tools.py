"""Tool calls in conversations: held to the tools by a grammar, read back, and an agent's steps reusing their cells.

On every model: Qwen2.5's template renders the tools itself (its <tool_call> is one token, so
"auto" holds a call to the grammar once it opens); the others get them in the system message.
"""

from __future__ import annotations

import json

from pc_cpu.stream import ToolCallStream

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SYSTEM = {"role": "system", "content": "You are a travel assistant. Use the tools to answer."}


def _ask(question: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": question}]


def _check_call(call: dict, name: str | None = None) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert arguments["city"] in ("Paris", "Oslo", "Lima")
    else:
        assert call["function"]["name"] == "get_time" and arguments["zone"] in ("CET", "UTC")
    assert name is None or call["function"]["name"] == name


def test_required_and_named_choices_answer_with_calls_the_tools_admit(make_cache):
    cache = make_cache(store=False)
    required = cache.chat(_ask("What is the weather in Paris?"), tools=TOOLS, tool_choice="required",
                          parallel_tool_calls=False, max_tokens=48)
    assert required.finish_reason == "tool_calls" and len(required.tool_calls) == 1 and required.text == ""
    _check_call(required.tool_calls[0])
    named = cache.chat(_ask("What is the weather in Paris?"), tools=TOOLS, max_tokens=48,
                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.tool_calls
    for call in named.tool_calls:
        _check_call(call, "get_time")
    baseline = cache.chat(_ask("What is the weather in Paris?"), tools=TOOLS, tool_choice="required",
                          parallel_tool_calls=False, max_tokens=48, use_cache=False)
    assert baseline.token_ids == required.token_ids


def test_an_agents_next_step_computes_only_the_tool_result_and_answers_as_the_full_prefill(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    messages = _ask("What is the weather in Oslo?")
    step1 = cache.chat(messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    call = step1.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": step1.tool_calls},
                 {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "clear", "celsius": -3}'}]
    cache.wait_idle()  # the repair: the call computed again as a full prefill computes it, then stored
    step2 = cache.chat(messages, tools=TOOLS, max_tokens=12)
    answered = cache.conversations.prompt(messages[:3], add_generation_prompt=False, tools=TOOLS)
    assert step2.cached_tokens >= answered.answers[-1][1]  # the history up to the call's end came back
    assert step2.uncached_tokens < 40  # the tool's result and the markup around it
    baseline = cache.chat(messages, tools=TOOLS, max_tokens=12, use_cache=False)
    assert step2.token_ids == baseline.token_ids
    cache.evict()
    from_ram = cache.chat(messages, tools=TOOLS, max_tokens=12)
    assert from_ram.tiers == {"#conversation": "ram"} and from_ram.token_ids == baseline.token_ids


def test_agents_with_the_same_system_prompt_and_tools_share_their_cells(make_cache):
    cache = make_cache(store=False)
    first = cache.chat(_ask("Weather in Lima?"), tools=TOOLS, max_tokens=4)
    other = _ask("What time is it in Paris?")
    second = cache.chat(other, tools=TOOLS, max_tokens=4)
    shared = cache.conversations.prompt(other, tools=TOOLS).cuts[0]  # the system message, tools and markup
    if not cache.conversations.cells.can_cut:
        shared = 0  # a sliding-window model (Gemma 3) cannot keep part of another stream: its window cells
    assert first.cached_tokens == 0 and second.cached_tokens == shared
    assert second.token_ids == cache.chat(other, tools=TOOLS, max_tokens=4, use_cache=False).token_ids


def test_a_streamed_answer_shows_no_call_markup_and_ends_with_the_calls(make_cache):
    cache = make_cache(store=False)
    stream = cache.stream_chat(_ask("Weather in Paris, and the time in CET?"), tools=TOOLS, tool_choice="required",
                               max_tokens=96)
    assert isinstance(stream, ToolCallStream)
    pieces = list(stream)
    assert "".join(pieces).strip() == stream.result.text and "<tool_call>" not in "".join(pieces)
    assert stream.result.tool_calls
    for call in stream.result.tool_calls:
        _check_call(call)
    without = cache.stream_chat(_ask("Weather in Paris?"), tools=TOOLS, tool_choice="none", max_tokens=8)
    assert not isinstance(without, ToolCallStream)
    list(without)
    assert without.result.tool_calls is None


def test_tool_answers_are_the_same_in_any_company(make_cache):
    # Each agent's answer with a grammar (required), lazily (auto) and with penalties, alone and all at once.
    from tests.engine.test_scheduler import run_in_threads

    cache = make_cache(store=False, parallel=4)
    asks = [(_ask("Weather in Paris?"), {"tool_choice": "required"}),
            (_ask("What time is it in CET?"), {"tool_choice": "auto", "repeat_penalty": 1.3}),
            (_ask("Weather in Oslo and Lima?"), {"tool_choice": "required", "frequency_penalty": 0.5}),
            (_ask("Hello there."), {"tool_choice": "none", "presence_penalty": 0.5})]

    def answer(item):
        messages, options = item
        return cache.chat(messages, tools=TOOLS, max_tokens=40, **options).token_ids

    alone = [answer(item) for item in asks]
    assert run_in_threads(answer, asks) == alone
    assert cache.workbench.scheduler.stats.max_batch > 1  # they did run together


def test_an_agents_own_history_wins_over_another_agents_stream_sharing_its_system_prompt(make_cache):
    # Agent B's first step takes over agent A's stream (they share the system message and tools);
    # A's next step must then restore A's own stored turn, not settle for B's shared prefix.
    cache = make_cache(store=False, parallel=2)
    a, b = _ask("Weather in Oslo?"), _ask("Time in UTC?")
    first = cache.chat(a, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    cache.wait_idle()
    cache.chat(b, tools=TOOLS, max_tokens=4)
    cache.wait_idle()
    a += [{"role": "assistant", "content": None, "tool_calls": first.tool_calls},
          {"role": "tool", "tool_call_id": first.tool_calls[0]["id"], "content": '{"sky": "clear"}'}]
    second = cache.chat(a, tools=TOOLS, max_tokens=4)
    if cache.conversations.cells.can_cut:  # a sliding-window model keeps no part of a stream: nothing to compare
        answered = cache.conversations.prompt(a[:3], add_generation_prompt=False, tools=TOOLS)
        assert second.cached_tokens >= answered.answers[-1][1]  # A's turn up to its call's end
    assert second.token_ids == cache.chat(a, tools=TOOLS, max_tokens=4, use_cache=False).token_ids
