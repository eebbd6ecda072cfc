"""Many clients at once, and clients that leave mid-stream."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.conftest import DOC_PROMPT, sse_events


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


def test_a_client_leaving_mid_stream_frees_its_stream(server, client, server_cache):
    full_ms = server_cache.generate(DOC_PROMPT, max_tokens=800).total_ms
    with httpx.Client(base_url=server.base_url, timeout=30) as leaving:
        with leaving.stream("POST", "/v1/completions",
                            json={"prompt": DOC_PROMPT, "max_tokens": 800, "stream": True}) as response:
            next(response.iter_lines())  # the first piece arrived: generation is under way
            left = time.perf_counter()
    # Closed well before the 800 tokens were generated.
    while _active_streams(client) and (time.perf_counter() - left) * 1000 < full_ms:
        time.sleep(0.02)
    assert _active_streams(client) == 0
    assert (time.perf_counter() - left) * 1000 < full_ms
    answer = client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4}, timeout=10)
    assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length"


def test_a_client_leaving_a_non_streamed_request_frees_it(server, client):
    try:
        httpx.post(server.base_url + "/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 1500}, timeout=0.3)
    except httpx.TimeoutException:
        pass
    deadline = time.perf_counter() + 5
    while _active_streams(client) and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert _active_streams(client) == 0
    assert client.post("/v1/completions", json={"prompt": DOC_PROMPT, "max_tokens": 4}).status_code == 200
