"""llama.cpp's own server as a peer: built from the llama.cpp pc_cpu runs on, run with its cache on, timed per request.

`build_llama_server` builds `llama-server` from the llama.cpp that llama-cpp-python's sdist vendors
(the version pyproject.toml pins, so the same commit as pc_cpu's): pip download of the sdist, then
CMake, target llama-server, into $PC_CPU_LLAMA_SERVER_DIR (default ~/.cache/pc_cpu/llama-server).
It downloads, so it runs only when a bench is asked to build (bench/llama_server_peer.py); `pc-cpu
bench peers --llama-server PATH` takes a binary.

`LlamaServer` runs it on 127.0.0.1 with its cache on: `cache_prompt` (sent with every request),
`--cache-reuse 256` (chunks of the slot's previous prompt shifted into place), `--cache-ram 8192`
(idle slots' states kept in host RAM and the best match swapped in); `--no-repack` when pc_cpu's
CPU check turned extra buffers off (pc_cpu.engine.llama.extra_buffers: llama.cpp's AMX matmul
crashed on an Intel AMX Xeon), flash attention as the caller says (pc_cpu's default for the
model). `-c` is the whole KV pool split across `--parallel` slots, so each slot gets n_ctx cells.
A completion is sent as token ids (so both systems see the same tokens) and streamed: its TTFT
is the wall time to the first streamed token (loopback HTTP adds ~1 ms).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SERVER_DIR = Path(os.environ.get("PC_CPU_LLAMA_SERVER_DIR", Path.home() / ".cache" / "pc_cpu" / "llama-server"))
LLAMA_CPP_PYTHON = "0.3.36"  # the pin in pyproject.toml: the llama.cpp pc_cpu runs on


def built_binary(directory: Path = SERVER_DIR) -> Path:
    """Returns where build_llama_server puts the binary in `directory` (it may not exist yet)."""
    return directory / "build" / "bin" / "llama-server"


def build_llama_server(directory: Path = SERVER_DIR) -> Path:
    """Returns llama-server built from llama-cpp-python's sdist (pip download), building it once into `directory`."""
    binary = built_binary(directory)
    if binary.exists():
        return binary
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(directory)], check=True)
    with tarfile.open(directory / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as sdist:
        sdist.extractall(directory, filter="data")
    source = directory / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    subprocess.run(["cmake", "-S", str(source), "-B", str(directory / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=ON"], check=True)
    subprocess.run(["cmake", "--build", str(directory / "build"), "--target", "llama-server",
                    "-j", str(os.cpu_count() or 2)], check=True)
    return binary


class LlamaServer:
    """A llama-server process on 127.0.0.1 with its cache on (module docstring); a context manager."""

    def __init__(self, binary: Path, model: Path, *, threads: int, n_ctx: int, slots: int, flash_attn: bool,
                 no_repack: bool):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx * slots), "--parallel", str(slots),
                     "--cache-reuse", "256", "--cache-ram", "8192", "-fa", "on" if flash_attn else "off",
                     "--no-webui", "--log-disable"] + (["--no-repack"] if no_repack else [])
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.process.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError("llama-server did not answer /health in 300 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(30)

    def complete(self, tokens: list[int], n_predict: int, *, cache_prompt: bool = True) -> dict:
        """Returns {ttft_ms, text, cached} of one greedy completion of `tokens`, streamed."""
        body = {"prompt": tokens, "n_predict": n_predict, "cache_prompt": cache_prompt, "temperature": 0.0,
                "stream": True, "samplers": ["top_k"], "top_k": 1}
        request = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started, ttft, text, cached = time.perf_counter(), None, [], None
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if ttft is None:
                    ttft = (time.perf_counter() - started) * 1000
                text.append(event.get("content", ""))
                if event.get("stop"):
                    cached = event.get("timings", {}).get("cache_n")
        return {"ttft_ms": ttft, "text": "".join(text), "cached": cached}
