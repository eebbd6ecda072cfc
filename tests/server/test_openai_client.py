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


CONVERSATION = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "Name a boat."}]


def test_plain_chat_answers_as_the_full_prefill_and_reuses_the_previous_turn(oai, server_cache):
    first = oai.chat.completions.create(model="tiny", messages=CONVERSATION, max_tokens=8, temperature=0)
    messages = CONVERSATION + [{"role": "assistant", "content": first.choices[0].message.content},
                               {"role": "user", "content": "And another one?"}]
    server_cache.wait_idle()  # the first answer's cells repaired and stored, as between a user's turns
    baseline = server_cache.chat(messages, max_tokens=8, use_cache=False)
    second = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert second.choices[0].message.content == baseline.text
    assert second.usage.prompt_tokens == baseline.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    pieces = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == baseline.text


@pytest.mark.parametrize("messages, fragment", [
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "end with the user's message"),
    ([{"role": "wizard", "content": "x"}], "role 'wizard'"),
    ([{"role": "user", "content": "   "}], "every user message is empty"),
])
def test_a_conversation_that_cannot_be_answered_is_a_bad_request_naming_why(oai, messages, fragment):
    with pytest.raises(openai.BadRequestError, match=fragment):
        oai.chat.completions.create(model="tiny", messages=messages, max_tokens=3)


def test_after_edit_reuse_moves_the_turns_after_an_edited_message_and_a_bad_value_is_refused(oai, server_cache):
    notes = "My notes: " + " ".join(f"boat fact {i} is worth a line." for i in range(8))
    messages = [CONVERSATION[0], {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": notes}]
    first = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    server_cache.wait_idle()
    edited = [CONVERSATION[0], {"role": "user", "content": "Hello there."}] + messages[2:] + [
        {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Why?"}]
    reused = oai.chat.completions.create(model="tiny", messages=edited, max_tokens=8, temperature=0,
                                         extra_body={"after_edit": "reuse"})
    # The notes and the answer after the edited message are moved, not computed.
    assert reused.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens - 12
    with pytest.raises(openai.UnprocessableEntityError, match="after_edit='sometimes': use one of recompute, reuse"):
        oai.chat.completions.create(model="tiny", messages=edited, max_tokens=3, extra_body={"after_edit": "sometimes"})
