# Derived from llama.cpp's tools/server/tests/utils.py (the ServerProcess fixture), as vendored by
# llama-cpp-python 0.3.36 (llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f, 2026-10-01),
# adapted to start `pc-cpu serve` instead of llama-server.
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
"""Starts `pc-cpu serve` for llama.cpp's server tests, with the interface of their ServerProcess.

Changes from llama.cpp's utils.py:
- start() runs `pc-cpu serve --model MODEL --host 127.0.0.1 --port P --store TMP --threads 2`
  (MODEL: $PC_CPU_TEST_MODEL, else qwen2.5-coder-0.5b; P: a free loopback port; TMP: a fresh
  temporary store, removed by stop()), with --n-ctx and --parallel from n_ctx and n_slots. It
  waits for GET /health as theirs does. llama-server's other flags (--jinja, --chat-template,
  --alias, --slots, ...) have no pc-cpu equivalent: tests that depend on them are skipped.
- Paths are OpenAI's, under /v1: "/chat/completions" is sent to "/v1/chat/completions" (llama-server
  serves both; OpenAI clients put /v1 in their base URL).
- make_any_request() no longer asserts llama-server's `timings` in the usage chunk (an extension)
  and asks for that chunk with stream_options.include_usage, as OpenAI's API wants.
- No model download (the model is one pc_cpu has installed) and no network at run time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from re import RegexFlag
from typing import Any, Callable, Iterator, List, Set, Tuple

import requests

DEFAULT_HTTP_TIMEOUT = 120  # seconds for the server to answer /health
DEFAULT_REQUEST_TIMEOUT = 600

MODEL = os.environ.get("PC_CPU_TEST_MODEL", "qwen2.5-coder-0.5b")
THREADS = int(os.environ.get("PC_CPU_TEST_THREADS", "2"))
PC_CPU = str(Path(sys.executable).with_name("pc-cpu"))


class ServerResponse:
    headers: dict
    status_code: int
    body: dict | Any


class ServerError(Exception):
    def __init__(self, code, body):
        self.code = code
        self.body = body


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    server_host: str = "127.0.0.1"
    server_port: int = 8080
    model: str = MODEL
    n_threads: int | None = THREADS
    n_ctx: int | None = None
    n_slots: int | None = None
    n_predict: int | None = None  # llama-server's --n-predict; pc-cpu has none (max_tokens per request)
    temperature: float = 0.8  # llama-server's --temp; pc-cpu's default is per request (0)
    seed: int = 42
    debug: bool = False

    process: subprocess.Popen | None = None

    def __init__(self):
        self.store_dir: str | None = None
        self.log_path: str | None = None

    def start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
        self.server_port = _free_port()
        self.store_dir = tempfile.mkdtemp(prefix="pc_cpu_llama_tests_")
        args = [PC_CPU, "serve", "--model", self.model, "--host", self.server_host, "--port", self.server_port,
                "--store", self.store_dir]
        if self.n_threads:
            args += ["--threads", self.n_threads]
        if self.n_ctx:
            args += ["--n-ctx", self.n_ctx]
        if self.n_slots:
            args += ["--parallel", self.n_slots]
        if self.debug:
            args.append("--verbose")
        args = [str(arg) for arg in args]
        print(f"tests: starting server with: {' '.join(args)}")
        self.log_path = os.path.join(self.store_dir, "server.log")
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k != "PC_CPU_API_KEY"}
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        server_instances.add(self)
        print(f"server pid={self.process.pid}, pytest pid={os.getpid()}")

        start_time = time.time()
        while time.time() - start_time < timeout_seconds:
            try:
                response = self.make_request("GET", "/health", timeout=5)
                if response.status_code == 200:
                    self.ready = True
                    return
            except Exception:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"Server process died with return code {self.process.returncode}: "
                                   f"{Path(self.log_path).read_text()[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"Server did not start within {timeout_seconds} seconds")

    def stop(self) -> None:
        if self in server_instances:
            server_instances.remove(self)
        if self.process:
            print(f"Stopping server with pid={self.process.pid}")
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
            self.process = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        if self.store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            self.store_dir = None

    def base_url(self) -> str:
        """The base URL an OpenAI client takes."""
        return f"http://{self.server_host}:{self.server_port}/v1"

    def make_url(self, path: str) -> str:
        if path != "/health" and not path.startswith("/v1/"):
            path = "/v1" + path  # llama-server also serves OpenAI's routes without /v1
        return f"http://{self.server_host}:{self.server_port}{path}"

    def model_id(self) -> str:
        """The one id GET /v1/models lists."""
        return self.make_request("GET", "/v1/models").body["data"][0]["id"]

    def make_request(self, method: str, path: str, data: dict | Any | None = None, headers: dict | None = None,
                     timeout: float | None = DEFAULT_REQUEST_TIMEOUT) -> ServerResponse:
        url = self.make_url(path)
        if method == "GET":
            response = requests.get(url, headers=headers, timeout=timeout)
        elif method == "POST":
            response = requests.post(url, headers=headers, json=data, timeout=timeout)
        elif method == "DELETE":
            response = requests.delete(url, headers=headers, timeout=timeout)
        else:
            raise ValueError(f"Unimplemented method: {method}")
        result = ServerResponse()
        result.headers = dict(response.headers)
        result.status_code = response.status_code
        try:
            result.body = response.json()
        except (json.JSONDecodeError, requests.exceptions.JSONDecodeError):
            result.body = response.text
        print("Response from server", json.dumps(result.body, indent=2))
        return result

    def make_stream_request(self, method: str, path: str, data: dict | None = None,
                            headers: dict | None = None) -> Iterator[dict]:
        url = self.make_url(path)
        if method != "POST":
            raise ValueError(f"Unimplemented method: {method}")
        response = requests.post(url, headers=headers, json=data, stream=True, timeout=DEFAULT_REQUEST_TIMEOUT)
        if response.status_code != 200:
            raise ServerError(response.status_code, response.json())
        for line_bytes in response.iter_lines():
            line = line_bytes.decode("utf-8")
            if "[DONE]" in line:
                break
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                print("Partial response from server", json.dumps(chunk, indent=2))
                yield chunk

    def make_any_request(self, method: str, path: str, data: dict | None = None, headers: dict | None = None,
                         timeout: float | None = DEFAULT_REQUEST_TIMEOUT) -> dict:
        stream = data.get("stream", False)
        if stream:
            data = {**data, "stream_options": {"include_usage": True}}
            content: list[str] = []
            reasoning_content: list[str] = []
            tool_calls: list[dict] = []
            finish_reason = None
            usage_seen = False

            for chunk in self.make_stream_request(method, path, data, headers):
                if chunk["choices"]:
                    assert len(chunk["choices"]) == 1, f'Expected 1 choice, got {len(chunk["choices"])}'
                    choice = chunk["choices"][0]
                    if choice["delta"].get("content"):  # llama-server sends none empty; OpenAI's first is ""
                        content.append(choice["delta"]["content"])
                    if choice["delta"].get("reasoning_content") is not None:
                        assert len(choice["delta"]["reasoning_content"]) > 0
                        reasoning_content.append(choice["delta"]["reasoning_content"])
                    if choice.get("finish_reason") is not None:
                        finish_reason = choice["finish_reason"]
                    for tc in choice["delta"].get("tool_calls") or []:
                        if "function" not in tc:
                            raise ValueError(f"Expected function type, got {tc['type']}")
                        if tc["index"] >= len(tool_calls):
                            assert "id" in tc
                            assert tc.get("type") == "function"
                            assert "function" in tc and "name" in tc["function"] and len(tc["function"]["name"]) > 0
                            tool_calls.append(dict(id="", type="function", function=dict(name="", arguments="")))
                        tool_call = tool_calls[tc["index"]]
                        if tc.get("id") is not None:
                            tool_call["id"] = tc["id"]
                        fct = tc["function"]
                        assert "id" not in fct, f"Function call should not have id: {fct}"
                        if fct.get("name") is not None:
                            tool_call["function"]["name"] = tool_call["function"].get("name", "") + fct["name"]
                        if fct.get("arguments") is not None:
                            tool_call["function"]["arguments"] += fct["arguments"]
                else:
                    # With include_usage, the last chunk before [DONE] has an empty `choices` and the usage.
                    assert "usage" in chunk, f"Expected usage in chunk: {chunk}"
                    usage_seen = True
            assert usage_seen, "Expected a last chunk with the usage (stream_options.include_usage)"
            result = dict(choices=[dict(index=0, finish_reason=finish_reason, message=dict(
                role="assistant", content="".join(content) if content else None,
                reasoning_content="".join(reasoning_content) if reasoning_content else None,
                tool_calls=tool_calls if tool_calls else None))])
            print("Final response from server", json.dumps(result, indent=2))
            return result
        response = self.make_request(method, path, data, headers, timeout=timeout)
        assert response.status_code == 200, f"Server returned error: {response.status_code}: {response.body}"
        return response.body


server_instances: Set[ServerProcess] = set()


class ServerPreset:
    @staticmethod
    def tinyllama2() -> ServerProcess:
        """llama.cpp's default preset (stories260K), here the pc_cpu model: same context and slots."""
        server = ServerProcess()
        server.n_ctx = 512
        server.n_slots = 2
        server.n_predict = 64
        server.seed = 42
        return server


def parallel_function_calls(function_list: List[Tuple[Callable[..., Any], Tuple[Any, ...]]]) -> List[Any]:
    results = [None] * len(function_list)
    exceptions = []

    def worker(index, func, args):
        try:
            results[index] = func(*args)
        except Exception as e:
            exceptions.append((index, str(e)))

    with ThreadPoolExecutor() as executor:
        futures = [executor.submit(worker, i, func, args) for i, (func, args) in enumerate(function_list)]
        for _ in as_completed(futures):
            pass
    for index, error in exceptions:
        print(f"Function at index {index}: {error}")
    return results


def match_regex(regex: str, text: str) -> bool:
    return re.compile(regex, flags=RegexFlag.IGNORECASE | RegexFlag.MULTILINE | RegexFlag.DOTALL).search(text) \
        is not None


# --- added for the adaptation -------------------------------------------------

def assert_client_error(res: ServerResponse | ServerError, *also: int) -> None:
    """The request is refused as the client's fault, with OpenAI's error object.

    llama-server answers 400 (OpenAI does too); pc-cpu answers 422 for a body that does not
    validate and 400 for a request it cannot serve, so both count as the refusal the test expects.
    """
    code = res.code if isinstance(res, ServerError) else res.status_code
    body = res.body
    assert code in (400, 422, *also), f"Expected a 400/422 refusal, got {code}: {body}"
    assert isinstance(body, dict) and "error" in body, body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body


def assert_fingerprint(value) -> None:
    """system_fingerprint: llama-server's is "b<build>"; OpenAI's is optional (null or a string)."""
    assert value is None or (isinstance(value, str) and value), f"system_fingerprint: {value!r}"


def model_path(name: str = MODEL) -> str:
    from pc_cpu.model_path import resolve_model_path

    return str(resolve_model_path(name))
