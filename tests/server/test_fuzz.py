"""A short seeded fuzz of the HTTP API over real HTTP; bench/fuzz.py runs the same requests by the ten thousand.

The requests and the oracle are tests/server/fuzz_api.py's: no 5xx, no path or traceback in any
body, every refusal a 4xx naming the field, every answer parsed by the `openai` client's types.
The server has a PromptCache and a store of its own: the fuzz adds and deletes documents and
schemas, which the session's server must not see.
"""

from __future__ import annotations

import logging

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from pc_cpu.server import ServerThread
from tests.server import fuzz_api

# derandomize: the same few hundred requests on every run, so a failure reproduces and CI is stable.
FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])


class _Errors(logging.Handler):
    """Keeps the server's log records of ERROR and above: a traceback the client never saw is a failure too."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def server_errors():
    handler = _Errors()
    loggers = [logging.getLogger(name) for name in ("pc_cpu", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def fuzz_client(tiny_model_path, tmp_path_factory, server_errors):
    from pc_cpu import PromptCache

    cache = PromptCache(tiny_model_path, n_ctx=1024, threads=2, n_seq_max=16,
                        store=tmp_path_factory.mktemp("fuzz-store"))
    try:
        with ServerThread(cache) as server, httpx.Client(base_url=server.base_url, timeout=120) as client:
            fuzz_api.prepare(client)
            yield client
    finally:
        cache.close()


@FUZZ
@given(sent=fuzz_api.requests)
def test_every_answer_passes_the_oracle(fuzz_client, sent):
    answer = fuzz_api.send(fuzz_client, sent)
    assert not fuzz_api.problems(sent, answer), (sent.describe(), answer.status, answer.text[:600])


def test_after_the_fuzz_the_server_is_healthy_and_logged_no_error(fuzz_client, server_errors):
    assert fuzz_client.get("/health").json()["status"] == "ok"
    logged = [f"{r.name}: {r.getMessage()}" for r in server_errors.records]
    assert not logged, logged
