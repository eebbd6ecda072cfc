"""Tools in a conversation's layout (pc_cpu.pml.tools, pc_cpu.pml.chat): checks, calls read from answers, rendering."""

from __future__ import annotations

import json

import pytest

from pc_cpu.errors import PromptError
from pc_cpu.pml.chat import ChatMessage, ChatTemplate, chat_prompt, check_messages
from pc_cpu.pml.tools import (ToolCall, ToolChoice, call_schema, check_tool_choice, check_tools, could_be_bare_call,
                              parse_tool_calls)
from tests.fake_tokenizer import WordTokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}

# Qwen2.5's template, cut to what tools need: tools in the system turn, calls in the assistant's, results as user turns.
# (Newlines after a block tag are trimmed, as llama.cpp and Hugging Face render: Qwen's writes them as strings.)
QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'Helper.' }}"
    "\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant{% if m.content %}{{ '\\n' + m.content }}{% endif %}"
    "{% for c in m.tool_calls %}{{ '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_calls_in_tags_are_read_with_their_arguments_and_the_rest_is_the_text():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}\n</tool_call>')
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    shaped = calls[0].openai()
    assert shaped["type"] == "function" and shaped["id"].startswith("call_")
    assert json.loads(shaped["function"]["arguments"]) == {"city": "Paris"}


def test_a_call_that_does_not_parse_stays_in_the_text_and_one_cut_short_is_read_if_whole():
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    assert parse_tool_calls(broken) == (broken, ())
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {}}')  # max_tokens hit
    assert content == "" and calls[0].name == "get_time"


def test_a_bare_json_call_is_read_only_when_it_names_a_tool_and_has_arguments():
    fenced = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
    assert parse_tool_calls(fenced, ["get_weather"])[1][0].arguments == {"city": "Oslo"}
    assert parse_tool_calls(fenced, ["get_time"]) == (fenced, ())  # not a tool of this request: text
    assert parse_tool_calls('{"name": "get_weather"}', ["get_weather"])[1] == ()  # an object with a name, no call
    assert parse_tool_calls(fenced) == (fenced, ())  # without tools, JSON is an answer
    assert could_be_bare_call("  ``") and could_be_bare_call('{"na') and not could_be_bare_call("The weather")


@pytest.mark.parametrize("tools, fragment", [
    ("get_weather", "tools must be a list"),
    ([{"type": "retrieval"}], "tools[0] is not a function tool"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name='has space'"),
    ([WEATHER, WEATHER], "a second function named 'get_weather'"),
    ([{"type": "function", "function": {"name": "f", "parameters": "object"}}], "must be a JSON schema object"),
])
def test_tools_that_cannot_be_offered_are_refused_naming_the_fault(tools, fragment):
    with pytest.raises(PromptError, match=None) as error:
        check_tools(tools)
    assert fragment in str(error.value)


@pytest.mark.parametrize("choice, tools, fragment", [
    ("sometimes", [WEATHER], "tool_choice='sometimes': use one of auto, none, required"),
    ("required", [], "needs tools"),
    ({"type": "function", "function": {"name": "get_time"}}, [WEATHER], "not among the tools (get_weather)"),
    ({"type": "function"}, [WEATHER], "tool_choice must be"),
])
def test_a_tool_choice_that_cannot_be_followed_is_refused_naming_why(choice, tools, fragment):
    with pytest.raises(PromptError) as error:
        check_tool_choice(choice, check_tools(tools))
    assert fragment in str(error.value)


def test_tool_choice_defaults_to_auto_with_tools_and_the_call_schema_follows_the_choice():
    tools = check_tools([WEATHER, TIME])
    assert check_tool_choice(None, tools) == ToolChoice("auto") and check_tool_choice(None, ()) == ToolChoice("none")
    named = call_schema(tools, ToolChoice("function", "get_weather"))
    assert named["properties"]["name"] == {"const": "get_weather"}
    assert named["properties"]["arguments"]["required"] == ["city"]
    assert len(call_schema(tools, ToolChoice("required"))["anyOf"]) == 2


def _agent(*, answered: bool) -> list[dict]:
    messages = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'}]
    return messages + ([{"role": "assistant", "content": "Sunny."}] if answered else [])


def test_a_template_that_takes_tools_renders_them_and_a_call_is_the_assistants_answer_span():
    tokenizer, template = WordTokenizer(), ChatTemplate(QWEN_LIKE)
    assert template.takes_tools
    prompt = chat_prompt(check_messages(_agent(answered=False)), template, tokenizer, tools=check_tools([WEATHER]))
    text = tokenizer.text(prompt.tokens)
    assert '"name":"get_weather","description":"Theweatherinacity"' in _squashed(text)  # tojson keeps key order
    (lo, hi), = prompt.answers
    assert _squashed(tokenizer.text(prompt.tokens[lo:hi])).startswith("<tool_call>")
    assert _squashed(tokenizer.text(prompt.tokens[lo:hi])).endswith("</tool_call>")
    assert "<tool_response>" in _squashed(tokenizer.text(prompt.tokens[hi:]))
    # The system message and tools are a call of their own: agents sharing them share their cells.
    assert prompt.cuts[0] == text.split().index("Weather")  # one word a token, BOS the first


def test_the_answer_as_sent_back_lays_out_as_the_next_step_begins():
    tokenizer, template, tools = WordTokenizer(), ChatTemplate(QWEN_LIKE), check_tools([WEATHER])
    step1 = chat_prompt(check_messages(_agent(answered=False)[:2]), template, tokenizer, tools=tools)
    answer = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(answer, ["get_weather"])
    answered = chat_prompt(check_messages(_agent(answered=False)[:2]) + (ChatMessage("assistant", content, calls),),
                           template, tokenizer, tools=tools, add_generation_prompt=False)
    step2 = chat_prompt(check_messages(_agent(answered=False)), template, tokenizer, tools=tools)
    assert answered.answers[-1][0] == step1.end  # the repair's span starts where the prompt ended
    end = answered.answers[-1][1]
    assert step2.tokens[:end] == answered.tokens[:end] and end in step2.cuts


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text():
    tokenizer, template = WordTokenizer(), ChatTemplate(CHATML)
    assert not template.takes_tools
    prompt = chat_prompt(check_messages(_agent(answered=True)), template, tokenizer, tools=check_tools([WEATHER]))
    text = _squashed(tokenizer.text(prompt.tokens))
    assert text.index("Youhelp.") < text.index("#Tools") < text.index('"get_weather"') < text.index("Weatherin")
    assert "<|im_start|>user<tool_response>" in text
    calls_span = prompt.answers[0]
    assert _squashed(tokenizer.text(prompt.tokens[calls_span[0]:calls_span[1]])).startswith("<tool_call>")


def _squashed(text: str) -> str:
    return "".join(text.split())


def test_a_last_assistant_message_is_continued():
    tokenizer, template = WordTokenizer(), ChatTemplate(CHATML)
    messages = check_messages([{"role": "user", "content": "Count"}, {"role": "assistant", "content": "one two"}])
    prompt = chat_prompt(messages, template, tokenizer)
    assert tokenizer.text(prompt.tokens).endswith("<|im_start|> assistant one two")
    assert prompt.answers[-1][1] == prompt.end


def test_history_calls_are_checked():
    with pytest.raises(PromptError, match="only the assistant's may"):
        check_messages([{"role": "user", "content": "x", "tool_calls": [
            {"function": {"name": "f", "arguments": "{}"}}]}])
    message = check_messages(_agent(answered=False))[2]
    assert message.tool_calls == (ToolCall("get_weather", {"city": "Paris"}, "call_1"),)
    assert check_messages(_agent(answered=False))[3].tool_call_id == "call_1"
