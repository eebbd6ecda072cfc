"""`pc-cpu serve`: loads schemas, serves on loopback, stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
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

WAIT_S = 120  # a deadline for what takes seconds: generous for a loaded machine


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


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20"])
def test_serve_refuses_a_non_loopback_host_without_a_key(host, capsys, monkeypatch):
    monkeypatch.delenv("PC_CPU_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_info:  # refused before the model loads: this one does not exist
        main(["serve", "--host", host, "--model", "/nonexistent/model.gguf"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: refusing to serve on {host} without an API key")
    assert "--api-key" in err and "PC_CPU_API_KEY" in err and "--insecure" in err
    for allowed in (["--insecure"], ["--api-key", "k"]):  # both get past the check, to the missing model
        with pytest.raises(SystemExit):
            main(["serve", "--host", host, "--model", "/nonexistent/model.gguf"] + allowed)
        assert "model file" in capsys.readouterr().err
    monkeypatch.setenv("PC_CPU_API_KEY", "k")
    with pytest.raises(SystemExit):
        main(["serve", "--host", host, "--model", "/nonexistent/model.gguf"])
    assert "model file" in capsys.readouterr().err


def test_serve_refuses_an_api_key_no_client_could_send_before_loading_the_model(capsys, monkeypatch):
    monkeypatch.setenv("PC_CPU_API_KEY", "sekrit key")
    with pytest.raises(SystemExit) as exit_info:  # this model does not exist: the key is refused first
        main(["serve", "--model", "/nonexistent/model.gguf"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: the API key (--api-key or $PC_CPU_API_KEY) has a space") and "sekrit" not in err


def test_serve_limit_defaults_are_the_servers():
    from pc_cpu.server.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SCHEMAS

    defaults = {p.name: p.default for p in cli.commands["serve"].params}
    assert (defaults["max_body_bytes"], defaults["max_schemas"]) == (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SCHEMAS)


def test_serve_answers_over_http_and_stops_on_ctrl_c(tiny_model_path, tmp_path):
    schema = tmp_path / "s.pml"
    schema.write_text(DOC_SCHEMA)
    port = _free_port()
    env = {**os.environ, "PC_CPU_API_KEY": " from-the-environment "}  # spaces around it are stripped
    process = subprocess.Popen([sys.executable, "-m", "pc_cpu.cli", "serve", "--port", str(port), "--schema",
                                str(schema), "--model", str(tiny_model_path), "--threads", "2", "--n-ctx", "512",
                                "--store", str(tmp_path / "store"), "--parallel", "2", "--ram-bytes", "64M",
                                "--disk-bytes", "1G"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_S  # it imports, loads the model and the schema first
        while True:
            try:
                health = httpx.get(base + "/health", timeout=WAIT_S).json()
                break
            except httpx.TransportError:
                if process.poll() is not None:
                    pytest.fail(f"pc-cpu serve exited with {process.returncode} before it served\n"
                                f"{process.stderr.read()}")
                assert time.monotonic() < deadline, f"pc-cpu serve did not answer /health within {WAIT_S} s"
                time.sleep(0.1)
        assert health["schemas"] == ["s"]
        request = {"prompt": DOC_PROMPT, "max_tokens": 3}
        assert httpx.post(base + "/v1/completions", json=request, timeout=WAIT_S).status_code == 401
        answer = httpx.post(base + "/v1/completions", json=request, timeout=WAIT_S,
                            headers={"Authorization": "Bearer from-the-environment"})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
        stats = httpx.get(base + "/v1/stats", timeout=WAIT_S, headers={"Authorization": "Bearer from-the-environment"})
        memory, tiers = stats.json()["memory"], stats.json()["tiers"]
        assert memory["streams"] == 1 + 2 + 2 and memory["ram_tier"] == 64 << 20  # the memory knobs reached the cache
        assert (tiers["ram"]["budget_bytes"], tiers["disk"]["budget_bytes"]) == (64 << 20, 1 << 30)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()  # this test's own server, by its handle
            process.communicate()
            raise
    assert process.returncode == 0, err
    assert "loaded schema 's': " in err and f"http://127.0.0.1:{port}" in err
