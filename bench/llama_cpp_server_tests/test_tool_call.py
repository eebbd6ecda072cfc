# Derived from llama.cpp's tools/server/tests/unit/test_tool_call.py, as vendored by llama-cpp-python 0.3.36
# (llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f, 2026-10-01), adapted to run against
# `pc-cpu serve` (see README.md in this folder for what was changed and why).
#
# MIT License
#
# Copyright (c) 2023-2026 The ggml authors
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.
"""llama.cpp's tool call tests, run against pc-cpu serve.

Theirs run each test over a list of Hugging Face models and chat templates; here each runs on the
one pc_cpu model (default qwen2.5-coder-0.5b, whose template renders tools), normal and streamed.
The requests and assertions on tool calls are theirs.
"""

import json
import re
from enum import Enum
from typing import TypedDict

import pytest

from server import *

server: ServerProcess

TIMEOUT_HTTP_REQUEST = 600  # theirs: 60 s; a 2-thread CPU needs longer for 512 tokens


@pytest.fixture(autouse=True)
def create_server():
    global server
    server = ServerPreset.tinyllama2()
    server.n_slots = 1
    server.n_ctx = 8192


class CompletionMode(Enum):
    NORMAL = "normal"
    STREAMED = "streamed"


class ToolParameters(TypedDict):
    type: str
    properties: dict[str, dict]
    required: list[str]


class ToolFunction(TypedDict):
    name: str
    description: str
    parameters: ToolParameters


class ToolDefinition(TypedDict):
    type: str
    function: ToolFunction


TEST_TOOL = ToolDefinition(
    type="function",
    function=ToolFunction(
        name="test",
        description="",
        parameters=ToolParameters(
            type="object",
            properties={
                "success": {
                    "type": "boolean",
                    "const": True,
                },
            },
            required=["success"],
        ),
    ),
)

PYTHON_TOOL = ToolDefinition(
    type="function",
    function=ToolFunction(
        name="python",
        description="Runs code in an ipython interpreter and returns the result of the execution after 60 seconds.",
        parameters=ToolParameters(
            type="object",
            properties={
                "code": {
                    "type": "string",
                    "description": "The code to run in the ipython interpreter.",
                },
            },
            required=["code"],
        ),
    ),
)

WEATHER_TOOL = ToolDefinition(
    type="function",
    function=ToolFunction(
        name="get_current_weather",
        description="Get the current weather in a given location",
        parameters=ToolParameters(
            type="object",
            properties={
                "location": {
                    "type": "string",
                    "description": "The city and country/state, e.g. 'San Francisco, CA', or 'Paris, France'",
                },
            },
            required=["location"],
        ),
    ),
)

STREAM = pytest.mark.parametrize("stream", [CompletionMode.NORMAL, CompletionMode.STREAMED])


# Theirs: over 11 models x 3 templates (slow); here the pc_cpu model with its own template.
@pytest.mark.slow
@STREAM
@pytest.mark.parametrize("tool,argument_key", [
    (TEST_TOOL, "success"),
    (PYTHON_TOOL, "code"),
])
def test_completion_with_required_tool_real_model(tool: dict, argument_key: str | None, stream: CompletionMode):
    global server
    n_predict = 512
    server.start()
    body = server.make_any_request("POST", "/v1/chat/completions", data={
        "max_tokens": n_predict,
        "messages": [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "Write an example"},
        ],
        "tool_choice": "required",
        "tools": [tool],
        "parallel_tool_calls": False,
        "stream": stream == CompletionMode.STREAMED,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
    }, timeout=TIMEOUT_HTTP_REQUEST)
    choice = body["choices"][0]
    tool_calls = choice["message"].get("tool_calls")
    assert tool_calls and len(tool_calls) == 1, f'Expected 1 tool call in {choice["message"]}'
    tool_call = tool_calls[0]
    expected_function_name = "python" if tool["type"] == "code_interpreter" else tool["function"]["name"]
    assert expected_function_name == tool_call["function"]["name"]
    actual_arguments = tool_call["function"]["arguments"]
    assert isinstance(actual_arguments, str)
    if argument_key is not None:
        actual_arguments = json.loads(actual_arguments)
        assert argument_key in actual_arguments, f"tool arguments: {json.dumps(actual_arguments)}, expected: {argument_key}"


def do_test_completion_without_tool_call(server: ServerProcess, n_predict: int, tools: list[dict], tool_choice: str | None, **kwargs):
    body = server.make_any_request("POST", "/v1/chat/completions", data={
        "max_tokens": n_predict,
        "messages": [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "say hello world with python"},
        ],
        "tools": tools if tools else None,
        "tool_choice": tool_choice,
        **kwargs,
    }, timeout=TIMEOUT_HTTP_REQUEST)
    choice = body["choices"][0]
    assert choice["message"].get("tool_calls") is None, f'Expected no tool call in {choice["message"]}'


# Theirs load the Llama 3.3 template file (--chat-template-file); here the model's own template.
@STREAM
@pytest.mark.parametrize("n_predict,tools,tool_choice", [
    (128, [], None),
    (128, [TEST_TOOL], None),
    (128, [PYTHON_TOOL], 'none'),
])
def test_completion_without_tool_call_fast(n_predict: int, tools: list[dict], tool_choice: str | None, stream: CompletionMode):
    global server
    server.start()
    do_test_completion_without_tool_call(server, n_predict, tools, tool_choice, stream=stream == CompletionMode.STREAMED)


@pytest.mark.slow
@STREAM
@pytest.mark.skip(reason="the same requests as test_completion_without_tool_call_fast, differing only in "
                         "llama-server's --chat-template-file (functionary, Llama 3.2), which pc-cpu has no equivalent of")
def test_completion_without_tool_call_slow(stream: CompletionMode):
    pass


# Theirs: over 13 models and templates; here the pc_cpu model.
@pytest.mark.slow
@STREAM
def test_weather(stream: CompletionMode):
    global server
    n_predict = 512
    server.start()
    do_test_weather(server, stream=stream == CompletionMode.STREAMED, max_tokens=n_predict)


def do_test_weather(server: ServerProcess, **kwargs):
    body = server.make_any_request("POST", "/v1/chat/completions", data={
        "messages": [
            {"role": "system", "content": "You are a chatbot that uses tools/functions. Dont overthink things."},
            {"role": "user", "content": "What is the weather in Istanbul?"},
        ],
        "tools": [WEATHER_TOOL],
        **kwargs,
    }, timeout=TIMEOUT_HTTP_REQUEST)
    choice = body["choices"][0]
    tool_calls = choice["message"].get("tool_calls")
    assert tool_calls and len(tool_calls) == 1, f'Expected 1 tool call in {choice["message"]}'
    tool_call = tool_calls[0]
    assert tool_call["function"]["name"] == WEATHER_TOOL["function"]["name"], f'Expected weather tool call, got {tool_call["function"]["name"]}'
    actual_arguments = json.loads(tool_call["function"]["arguments"])
    assert 'location' in actual_arguments, f"location not found in {json.dumps(actual_arguments)}"
    location = actual_arguments["location"]
    assert isinstance(location, str), f"Expected location to be a string, got {type(location)}: {json.dumps(location)}"
    assert re.match('^Istanbul(( |, ?)(TR|Turkey|Türkiye))?$', location), f'Expected Istanbul for location, got {location}'


# Theirs: over 11 models and templates; here the pc_cpu model.
@pytest.mark.slow
@STREAM
def test_calc_result(stream: CompletionMode):
    global server
    server.n_ctx = 8192 * 2
    server.start()
    do_test_calc_result(server, None, 128, stream=stream == CompletionMode.STREAMED)


def do_test_calc_result(server: ServerProcess, result_override: str | None, n_predict: int, **kwargs):
    body = server.make_any_request("POST", "/v1/chat/completions", data={
        "max_tokens": n_predict,
        "messages": [
            {"role": "system", "content": "You are a tools-calling assistant. You express numerical values with at most two decimals."},
            {"role": "user", "content": "What's the y coordinate of a point on the unit sphere at angle 30 degrees?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_6789",
                        "type": "function",
                        "function": {
                            "name": "calculate",
                            "arguments": "{\"expression\":\"sin(30 * pi / 180)\"}"
                        }
                    }
                ]
            },
            {
                "role": "tool",
                "name": "calculate",
                "content": "0.55644242476",
                "tool_call_id": "call_6789"
            }
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "calculate",
                    "description": "A calculator function that computes values of arithmetic expressions in the Python syntax",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "expression": {
                                "type": "string",
                                "description": "An arithmetic expression to compute the value of (Python syntad, assuming all floats)"
                            }
                        },
                        "required": ["expression"]
                    }
                }
            }
        ],
        **kwargs,
    }, timeout=TIMEOUT_HTTP_REQUEST)
    choice = body["choices"][0]
    tool_calls = choice["message"].get("tool_calls")
    assert tool_calls is None, f'Expected no tool call in {choice["message"]}'
    content = choice["message"].get("content")
    assert content is not None, f'Expected content in {choice["message"]}'
    if result_override is not None:
        assert re.match(result_override, content), f'Expected {result_override}, got {content}'
    else:
        assert re.match('^[\\s\\S]*?((That\'s|\\bis) (approximately )?)?\\b0\\.(5\\b|56\\b|556)', content), \
            f'Expected something like "The y coordinate is 0.56.", got {content}'


@pytest.mark.slow
@STREAM
@pytest.mark.skip(reason="not OpenAI's API: `reasoning_content` (DeepSeek's field) split by llama-server's "
                         "--reasoning-format from reasoning models' <think> text; no pc_cpu model reasons")
def test_thoughts(stream: CompletionMode):
    pass


# Theirs: over 20 models and templates; here the pc_cpu model.
@pytest.mark.slow
@STREAM
def test_hello_world(stream: CompletionMode):
    global server
    n_predict = 512
    server.start()
    do_test_hello_world(server, stream=stream == CompletionMode.STREAMED, max_tokens=n_predict)


def do_test_hello_world(server: ServerProcess, **kwargs):
    body = server.make_any_request("POST", "/v1/chat/completions", data={
        "messages": [
            {"role": "system", "content": "You are a tool-calling agent."},
            {"role": "user", "content": "say hello world with python"},
        ],
        "tools": [PYTHON_TOOL],
        **kwargs,
    }, timeout=TIMEOUT_HTTP_REQUEST)
    choice = body["choices"][0]
    tool_calls = choice["message"].get("tool_calls")
    assert tool_calls and len(tool_calls) == 1, f'Expected 1 tool call in {choice["message"]}'
    tool_call = tool_calls[0]
    assert tool_call["function"]["name"] == PYTHON_TOOL["function"]["name"]
    actual_arguments = json.loads(tool_call["function"]["arguments"])
    assert 'code' in actual_arguments, f"code not found in {json.dumps(actual_arguments)}"
    code = actual_arguments["code"]
    assert isinstance(code, str), f"Expected code to be a string, got {type(code)}: {json.dumps(code)}"
    assert re.match(r'''print\(("[Hh]ello,? [Ww]orld!?"|'[Hh]ello,? [Ww]orld!?')\)''', re.sub(r'#.*\n?', '', code)), f'Expected hello world, got {code}'
