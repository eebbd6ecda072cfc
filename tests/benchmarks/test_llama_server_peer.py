"""llama-server as a peer of `pc-cpu bench peers`: started with its cache on, sent token ids, timed to its first streamed token.

A stand-in for llama-server (a small HTTP server on 127.0.0.1 speaking its /health and streamed
/completion) checks what pc_cpu sends it; building the real one takes ~20 minutes
(bench/llama_server_peer.py), which is a bench's job, not a test's.
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap

import pytest
from click.testing import CliRunner

from pc_cpu.benchmarks import peers
from pc_cpu.benchmarks.llama_server import LlamaServer
from pc_cpu.cli import cli
from pc_cpu.errors import PromptCacheError

STAND_IN = textwrap.dedent('''\
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    assert args[args.index("--host") + 1] == "127.0.0.1"
    with open(args[args.index("-m") + 1] + ".args.json", "w") as f:
        json.dump(args, f)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ok = (self.path == "/completion" and body["cache_prompt"] and body["stream"]
                  and all(isinstance(t, int) for t in body["prompt"]) and body["prompt"])
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if ok:
                for event in ({"content": "Paris"}, {"content": "", "stop": True,
                                                     "timings": {"cache_n": len(body["prompt"]) - 1}}):
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
                    self.wfile.flush()

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


@pytest.fixture
def stand_in(tmp_path):
    """Returns an executable that answers as llama-server does (module docstring)."""
    path = tmp_path / "llama-server"
    path.write_text(f"#!{sys.executable}\n" + STAND_IN)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_completion_is_sent_as_token_ids_and_timed_to_its_first_streamed_token(stand_in, tmp_path):
    model = tmp_path / "model.gguf"
    with LlamaServer(stand_in, model, threads=2, n_ctx=512, slots=4, flash_attn=False, no_repack=True) as server:
        done = server.complete([1, 2, 3], 4)
    assert done["text"] == "Paris" and done["cached"] == 2 and done["ttft_ms"] > 0
    args = json.loads((tmp_path / "model.gguf.args.json").read_text())
    assert args[args.index("-c") + 1] == "2048" and args[args.index("--parallel") + 1] == "4"  # n_ctx cells per slot
    assert args[args.index("--cache-reuse") + 1] == "256" and "--cache-ram" in args and "--no-repack" in args


def test_llama_server_joins_the_peers_on_the_same_prompts(tiny_model_path, stand_in):
    data = peers.run(tiny_model_path, threads=2, doc_tokens=120, n_docs=4, repeats=1, llama_server=stand_in)
    for workload in data["workloads"]:
        server = workload["systems"][peers.LLAMA_SERVER]
        assert server["n"] == 1 and server["p50"] > 0
    assert "--cache-reuse" in data["llama_server"]


def test_a_missing_binary_is_refused_before_anything_is_measured(tiny_model_path, tmp_path):
    with pytest.raises(PromptCacheError, match="llama-server binary .* is not a file"):
        peers.run(tiny_model_path, threads=2, llama_server=tmp_path / "nothing")
    result = CliRunner().invoke(cli, ["bench", "peers", "--llama-server", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "does not exist" in result.output
