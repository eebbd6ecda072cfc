"""`pc-cpu serve`: loads schemas, serves on loopback, stops cleanly on Ctrl-C."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from pc_cpu.cli import cli, main
from tests.server.conftest import DOC_PROMPT, DOC_SCHEMA


def test_serve_help_needs_no_model():
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0 and "--schema" in result.output and "127.0.0.1" in result.output


def test_a_missing_schema_file_is_a_one_line_error(tiny_model_path, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model", str(tiny_model_path), "--schema", str(tmp_path / "missing.pml")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: schema ")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_answers_over_http_and_stops_on_ctrl_c(tiny_model_path, tmp_path):
    schema = tmp_path / "s.pml"
    schema.write_text(DOC_SCHEMA)
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "pc_cpu.cli", "serve", "--port", str(port), "--schema",
                                str(schema), "--model", str(tiny_model_path), "--threads", "2", "--n-ctx", "512",
                                "--store", str(tmp_path / "store")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                health = httpx.get(base + "/health", timeout=1).json()
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
                time.sleep(0.1)
        assert health["schemas"] == ["s"]
        answer = httpx.post(base + "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 3}, timeout=10)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "loaded schema 's'" in err and f"http://127.0.0.1:{port}" in err
