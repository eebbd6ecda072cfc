"""Access control and limits through the real server: the API key, body size, schemas held, the bind check."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from pc_cpu.errors import ConfigError, PromptCacheError
from pc_cpu.server import ServerThread
from pc_cpu.server.app import create_app
from pc_cpu.server.guard import check_exposure, is_loopback
from tests.server.conftest import DOC_PROMPT, DOC_SCHEMA

openai = pytest.importorskip("openai")

KEY = "sekrit-key-42"


@pytest.fixture(scope="module")
def keyed_server(server_cache):
    with ServerThread(server_cache, api_key=KEY) as running:
        yield running


def test_every_route_but_health_needs_the_key(keyed_server):
    base = keyed_server.base_url
    assert httpx.get(base + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        refused = httpx.get(base + "/v1/models", headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["type"] == "AuthenticationError"
        assert "Authorization: Bearer" in refused.json()["error"]["message"]
    refused = httpx.post(base + "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 2})
    assert refused.status_code == 401
    allowed = httpx.post(base + "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 2},
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert allowed.status_code == 200 and allowed.json()["usage"]["completion_tokens"] == 2


def test_the_openai_client_gets_in_with_the_key_only(keyed_server, server_cache):
    expected = server_cache.generate(DOC_PROMPT, max_tokens=6)
    with openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key=KEY, timeout=30, max_retries=0) as client:
        answer = client.completions.create(model="tiny", prompt=DOC_PROMPT, max_tokens=6, temperature=0)
        assert answer.choices[0].text == expected.text
        streamed = client.completions.create(model="tiny", prompt=DOC_PROMPT, max_tokens=6, stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed) == expected.text
    with openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key="not-the-key", timeout=30,
                       max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            stranger.completions.create(model="tiny", prompt=DOC_PROMPT, max_tokens=6)
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()


def test_a_body_over_the_limit_is_a_413_naming_the_flag(server_cache):
    with ServerThread(server_cache, max_body_bytes=2000) as server:
        small = httpx.post(server.base_url + "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 1},
                           timeout=30)
        assert small.status_code == 200
        big = {"prompt": DOC_PROMPT + " pad" * 1000, "max_tokens": 1}
        refused = httpx.post(server.base_url + "/v1/completions", json=big, timeout=30)
        assert refused.status_code == 413
        message = refused.json()["error"]["message"]
        assert "2000 bytes" in message and "--max-body-bytes" in message

        def chunks():  # no Content-Length: the limit is counted as the bytes arrive
            for _ in range(10):
                yield b"x" * 500

        refused = httpx.post(server.base_url + "/v1/schemas", content=chunks(), timeout=30)
        assert refused.status_code == 413 and "--max-body-bytes" in refused.text

        # A declared length over the limit is refused at once, without waiting for a body never sent.
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000000\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")


def test_schemas_beyond_the_limit_are_refused_until_one_is_deleted(make_cache, caplog):
    cache = make_cache(store=False)
    cache.load_schema(DOC_SCHEMA)
    other = '<schema name="other"><module name="m">Another note.</module></schema>'
    caplog.set_level(logging.INFO, logger="pc_cpu.server.app")
    with ServerThread(cache, max_schemas=1) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        refused = http.post("/v1/schemas", json={"pml": other})
        assert refused.status_code == 409
        assert "--max-schemas" in refused.json()["error"]["message"] and "1 schemas" in refused.json()["error"]["message"]
        assert cache.schemas.names == ["s"]
        assert http.post("/v1/schemas", json={"pml": DOC_SCHEMA}).status_code == 201  # same name: a replacement
        assert http.delete("/v1/schemas/s").status_code == 200
        assert http.post("/v1/schemas", json={"pml": other}).status_code == 201
        assert cache.schemas.names == ["other"]
    logged = [r.getMessage() for r in caplog.records if r.name == "pc_cpu.server.app"]
    assert any(m.startswith("loaded schema 'other': 1 of 1 modules, 3 tokens in ") and " s (" in m for m in logged), logged


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_serving_beyond_loopback_needs_a_key_or_insecure(host, server_cache):
    with pytest.raises(PromptCacheError, match="--api-key") as refused:
        check_exposure(host, None)
    assert "--insecure" in str(refused.value) and "\n" not in str(refused.value)
    check_exposure(host, KEY)
    check_exposure(host, None, insecure=True)
    with pytest.raises(PromptCacheError, match="without an API key"):
        ServerThread(server_cache, host=host)  # refused before anything binds


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_key(host):
    assert is_loopback(host)
    check_exposure(host, None)


@pytest.mark.parametrize("given", [f" {KEY}", f"{KEY}  ", f"\t{KEY}\n"])
def test_spaces_around_the_key_are_stripped_so_clients_get_in(server_cache, given):
    # A header value loses its surrounding spaces on the way: a key kept with them would match no request.
    with ServerThread(server_cache, api_key=given) as server:
        allowed = httpx.get(server.base_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert allowed.status_code == 200, allowed.text
        assert httpx.get(server.base_url + "/v1/models", headers={"Authorization": "Bearer x"}).status_code == 401


@pytest.mark.parametrize("given, problem", [
    ("", "is empty"),
    ("  \t ", "is empty"),
    ("sekrit key", "a space at character 7"),
    ("sekrit\tkey", "a tab or other control character at character 7"),
    ("key\x00", "a tab or other control character at character 4"),
    ("kéy", "a non-ASCII character at character 2"),
])
def test_a_key_no_client_could_send_is_refused_at_start_without_echoing_it(server_cache, given, problem):
    with pytest.raises(ConfigError) as refused:
        create_app(server_cache, api_key=given)
    message = str(refused.value)
    assert message.startswith("the API key (--api-key or $PC_CPU_API_KEY) ") and problem in message
    assert "secrets.token_urlsafe" in message and (given.strip() not in message or not given.strip())
