"""Many clients at once, and clients that leave mid-stream."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.conftest import DOC_PROMPT, sse_events

WAIT_S = 120  # a deadline for what takes a second or two: generous for a loaded machine


def _streamed_text(base_url: str, body: dict) -> str:
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
            assert response.status_code == 200
            events = sse_events(response)
    assert events[-1] == "[DONE]"
    return "".join(e["choices"][0]["text"] for e in events[:-1])


def test_eight_concurrent_streams_sharing_a_module_give_the_single_request_answer(server, server_cache):
    expected = server_cache.generate(DOC_PROMPT, max_tokens=24).text
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda _: _streamed_text(server.base_url, {"prompt": DOC_PROMPT, "max_tokens": 24}),
                              range(8)))
    assert texts == [expected] * 8


def _active_streams(client) -> int:
    return client.get("/health").json()["active_streams"]


def _wait_until(condition, what: str) -> None:
    """Returns once `condition()` holds; fails the test, saying `what` did not happen, after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S} s"
        time.sleep(0.05)


# Both tests below count the tokens decoded: a request that ran to its end decoded max_tokens - 1
# (its first token comes from its prefill), one cancelled when its client left, fewer. The server
# notices a client leave at its next piece; that it does before ~800 more is the only race left.

def test_a_client_leaving_mid_stream_frees_its_stream(server, client, server_cache):
    _wait_until(lambda: _active_streams(client) == 0, "earlier tests' streams were not closed")
    before = server_cache.workbench.scheduler.stats.tokens
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as leaving:
        with leaving.stream("POST", "/v1/completions",
                            json={"prompt": DOC_PROMPT, "max_tokens": 800, "stream": True}) as response:
            next(response.iter_lines())  # the first piece arrived: generation is under way
    _wait_until(lambda: _active_streams(client) == 0, "the stream its client left was not closed")
    assert server_cache.workbench.scheduler.stats.tokens - before < 799  # closed before its 800 tokens were generated
    answer = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4}, timeout=WAIT_S)
    assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length"


def test_a_client_leaving_a_non_streamed_request_frees_it(server, client, server_cache):
    _wait_until(lambda: _active_streams(client) == 0, "earlier tests' streams were not closed")
    stats, before = server_cache.workbench.scheduler.stats, server_cache.workbench.scheduler.stats.tokens
    body = json.dumps({"prompt": DOC_PROMPT, "max_tokens": 1500}).encode()
    # A raw socket, closed once the answer is being generated: a client timeout could fire before the request was sent.
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _wait_until(lambda: stats.tokens > before, "the request was not started")
    _wait_until(lambda: _active_streams(client) == 0, "the request its client left was not closed")
    assert stats.tokens - before < 1499  # closed before its 1,500 tokens were generated
    assert client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4}).status_code == 200
