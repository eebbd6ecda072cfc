"""Fixtures of the server tests: one real uvicorn server on a free loopback port, over the tiny model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

DOC_SCHEMA = '<schema name="s"><module name="doc">A short note about boats and the sea.</module></schema>'
DOC_PROMPT = '<prompt schema="s"><doc/> Tell me more:</prompt>'
CHAT_SCHEMA = ('<schema name="c"><system>You answer questions.</system>'
               '<user><module name="doc">A note about boats.</module></user></schema>')


@pytest.fixture(scope="session")
def server_cache(tiny_model_path):
    """The PromptCache the server answers from, with schemas 's' and 'c' loaded."""
    from pc_cpu import PromptCache

    cache = PromptCache(tiny_model_path, n_ctx=2048, threads=2, n_seq_max=32)
    cache.load_schema(DOC_SCHEMA)
    cache.load_schema(CHAT_SCHEMA)
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def server(server_cache):
    """A running server (pc_cpu.server.ServerThread); stopped, with every stream closed, at the end."""
    from pc_cpu.server import ServerThread

    with ServerThread(server_cache) as running:
        yield running


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        yield http


def sse_events(response) -> list:
    """Returns the parsed `data:` payloads of a streamed response; the final '[DONE]' stays a string."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
