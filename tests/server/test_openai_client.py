"""The official `openai` client against the server's base_url."""

from __future__ import annotations

import pytest

from tests.server.conftest import DOC_PROMPT

openai = pytest.importorskip("openai")


@pytest.fixture
def oai(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=30, max_retries=0)
    yield client
    client.close()


def test_completions(oai, server_cache):
    expected = server_cache.generate(DOC_PROMPT, max_tokens=10)
    answer = oai.completions.create(model="tiny", prompt=DOC_PROMPT, max_tokens=10, temperature=0)
    assert answer.choices[0].text == expected.text and answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens == expected.prompt_tokens
    pieces = oai.completions.create(model="tiny", prompt=DOC_PROMPT, max_tokens=10, stream=True)
    assert "".join(chunk.choices[0].text for chunk in pieces) == expected.text


def test_chat(oai, server_cache):
    expected = server_cache.generate('<prompt schema="c"><doc/><user>What does it say?</user></prompt>', max_tokens=10)
    messages = [{"role": "user", "content": "<doc/> What does it say?"}]
    answer = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=10, extra_body={"schema": "c"})
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens_details.cached_tokens == expected.cached_tokens
    chunks = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=10, stream=True,
                                         extra_body={"schema": "c"})
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text


def test_errors_raise_the_clients_bad_request(oai):
    with pytest.raises(openai.BadRequestError, match="not loaded"):
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                    extra_body={"schema": "nope"})
