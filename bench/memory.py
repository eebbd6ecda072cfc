"""Measures the resident memory of `pc-cpu serve` beside llama-cpp-python's own server, step by step through one workload.

Both servers run as processes on 127.0.0.1 with the same model, n_ctx, threads and slots
(llama-cpp-python's server answers one request at a time: `--parallel 1` here unless told), and
are sent the same conversations and the same document questions over the OpenAI chat API:
pc_cpu adds each document once (POST /v1/documents) and asks over it by id; llama-cpp-python's
server gets the document inline in the user message, the only way it takes one. After each step
the script reads each server's RSS and peak RSS from /proc; pc_cpu's own breakdown of its large
allocations (GET /v1/stats, pc_cpu.memory) is printed beside it. llama-cpp-python's server is
loaded with pc_cpu's extra-buffer decision (its defaults crash on CPUs whose AMX path does).

Steps: idle; 1, 4 and 8 conversations of 3 turns (interleaved); 10 and 100 documents, each asked
one question.

    python bench/memory.py --model smollm2-135m --out bench/results/memory_smollm2.json
    python bench/memory.py --model qwen2.5-coder-0.5b --ram-bytes 256M   # pc_cpu's knobs pass through
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("idle", "1 conversation", "4 conversations", "8 conversations", "10 documents", "100 documents")
# llama-cpp-python's server, with models loaded as pc_cpu loads them (extra buffers by pc_cpu's decision).
PEER = """
import sys
import llama_cpp
from pc_cpu.engine.llama.extra_buffers import model_params
llama_cpp.llama_cpp.llama_model_default_params = model_params
from llama_cpp.server.__main__ import main
sys.argv = ["llama_cpp.server", *sys.argv[1:]]
main()
"""


@dataclass
class Server:
    """A server process under measurement."""

    name: str
    process: subprocess.Popen
    base_url: str
    log: Path
    rows: list[dict] = field(default_factory=list)

    def memory(self) -> dict:
        """Returns the process's resident and peak resident bytes, from /proc."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {key: int(fields[name].split()[0]) * 1024 for key, name in (("rss", "VmRSS"), ("peak", "VmHWM"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, command: list[str], log_dir: Path, env: dict | None = None) -> Server:
    """Returns a started server once it answers GET /v1/models; raises with its log when it dies first."""
    port = free_port()
    log = log_dir / f"{name}.log"
    process = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT,
                               stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(name, process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}) before serving:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(server.base_url + "/v1/models", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{name} did not answer within 600 s:\n{log.read_text()[-2000:]}")


def chat(server: Server, messages: list[dict], max_tokens: int, **extra) -> str:
    """Returns the answer to `messages`; raises on any refusal (the workload is valid)."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def conversations(server: Server, count: int, turns: int, max_tokens: int) -> None:
    """Runs `count` conversations of `turns` turns, interleaved turn by turn."""
    histories = [[{"role": "system", "content": f"You are assistant number {i}. Answer briefly."}]
                 for i in range(count)]
    for turn in range(turns):
        for i, history in enumerate(histories):
            history.append({"role": "user", "content": f"Conversation {i}, turn {turn}: name a harbour town "
                                                       f"and one thing it is known for."})
            history.append({"role": "assistant", "content": chat(server, history, max_tokens)})


def document_text(i: int, words: int) -> str:
    """Returns invented document number `i`: ledger lines, about `words` words."""
    lines = [f"Ledger {i}, line {j}: the harbour office received {(i * 7 + j) % 13} crates of tea and "
             f"{(i + j) % 7} of silk from ship number {i * 100 + j}." for j in range(max(1, words // 20))]
    return "\n".join(lines)


def documents(server: Server, first: int, last: int, words: int, max_tokens: int) -> None:
    """Adds documents first..last-1 and asks one question over each (inline for a server without documents)."""
    for i in range(first, last):
        text, question = document_text(i, words), f"How many crates of tea came on line 3 of ledger {i}?"
        if server.name == "pc_cpu":
            response = httpx.post(server.base_url + "/v1/documents", json={"text": text, "name": f"ledger-{i}"},
                                  timeout=600)
            response.raise_for_status()
            chat(server, [{"role": "user", "content": question}], max_tokens, documents=[response.json()["id"]])
        else:  # ask's layout: the document, then the question, in the user's message
            chat(server, [{"role": "user", "content": f"{text}\n\n{question}"}], max_tokens)


def run_steps(server: Server, stats: bool, words: int, max_tokens: int) -> None:
    """Runs the workload's steps on `server`, recording its memory after each."""
    work = {"idle": lambda: None,
            "1 conversation": lambda: conversations(server, 1, 3, max_tokens),
            "4 conversations": lambda: conversations(server, 4, 3, max_tokens),
            "8 conversations": lambda: conversations(server, 8, 3, max_tokens),
            "10 documents": lambda: documents(server, 0, 10, words, max_tokens),
            "100 documents": lambda: documents(server, 10, 100, words, max_tokens)}
    for step in STEPS:
        started = time.monotonic()
        work[step]()
        row = {"step": step, **server.memory(), "seconds": round(time.monotonic() - started, 1)}
        if stats:
            got = httpx.get(server.base_url + "/v1/stats", timeout=60).json()
            row["tiers"] = got["tiers"]
            row["breakdown"] = got["memory"]
        server.rows.append(row)
        print(f"  {server.name:<10} {step:<16} RSS {row['rss'] / 2**20:7.0f} MiB  peak {row['peak'] / 2**20:7.0f} MiB"
              f"  ({row['seconds']:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="pc_cpu's slots (llama-cpp-python's server has one)")
    parser.add_argument("--ram-bytes", default=None, help="pc_cpu's RAM tier budget (default: serve's)")
    parser.add_argument("--words", type=int, default=300, help="words per document")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from pc_cpu.model_path import resolve_model_path  # loads no model
    path = str(resolve_model_path(args.model))
    with tempfile.TemporaryDirectory(prefix="pc_cpu-memory-") as tmp:
        tmp = Path(tmp)
        ours = [sys.executable, "-m", "pc_cpu.cli", "serve", "--model", path, "--n-ctx", str(args.n_ctx),
                "--threads", str(args.threads), "--parallel", str(args.parallel), "--store", str(tmp / "store")]
        if args.ram_bytes:
            ours += ["--ram-bytes", args.ram_bytes]
        peer = [sys.executable, "-c", PEER, "--model", path, "--n_ctx", str(args.n_ctx), "--n_threads",
                str(args.threads), "--n_threads_batch", str(args.threads), "--flash_attn", "false"]
        results = {}
        for name, command, stats in (("pc_cpu", ours, True), ("llama_cpp", peer, False)):
            server = start(name, command, tmp)
            try:
                run_steps(server, stats, args.words, args.max_tokens)
            finally:
                server.process.terminate()
                server.process.wait(timeout=60)
            results[name] = server.rows
    print(f"\n{'step':<16} {'pc_cpu RSS':>11} {'llama_cpp RSS':>14} {'ratio':>6}   (MiB; peak in brackets)")
    for ours_row, peer_row in zip(results["pc_cpu"], results["llama_cpp"]):
        print(f"{ours_row['step']:<16} {ours_row['rss'] / 2**20:6.0f} ({ours_row['peak'] / 2**20:4.0f})"
              f" {peer_row['rss'] / 2**20:7.0f} ({peer_row['peak'] / 2**20:4.0f}) {ours_row['rss'] / peer_row['rss']:6.2f}")
    breakdown = results["pc_cpu"][-1]["breakdown"]
    print("pc_cpu's large allocations (MiB): " + ", ".join(
        f"{k} {v / 2**20:.0f}" for k, v in breakdown.items() if k not in ("kv_cell", "streams")))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "model": Path(path).name,
                                        "n_ctx": args.n_ctx, "threads": args.threads, "parallel": args.parallel,
                                        "ram_bytes": args.ram_bytes, "words_per_document": args.words,
                                        "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
