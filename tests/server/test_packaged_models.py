"""The server on each installed packaged model: chat in the model's own template, answered as the library answers."""

from __future__ import annotations

import pytest

from pc_cpu.models import MODELS
from tests.conftest import packaged_model_path
from tests.server.conftest import CHAT_SCHEMA, httpx

# The 1.5B's load and prefill take ~3x the 0.5B's: -m slow runs it, as for the engine suite.
SERVED = [pytest.param(name, marks=pytest.mark.slow) if name == "qwen2.5-coder-1.5b" else name for name in MODELS]
QUESTION = "What is the note about?"


@pytest.mark.parametrize("name", SERVED)
def test_chat_on_a_packaged_model_is_its_template_and_the_library_answer(name):
    from pc_cpu import PromptCache
    from pc_cpu.server import ServerThread

    cache = PromptCache(packaged_model_path(name), n_ctx=2048, threads=2)
    try:
        cache.load_schema(CHAT_SCHEMA)
        pml = f'<prompt schema="c"><doc/><user>{QUESTION}</user></prompt>'
        expected = cache.generate(pml, max_tokens=12)
        full = cache.generate(pml, max_tokens=12, use_cache=False)
        # The model's own turn markup ends the prompt and opens the answer: its GGUF template's where it
        # has one (Gemma 3 270M, a base model, has none and gets plain "User:"/"Assistant:" turns).
        markup, tokens = cache.schemas.markup, list(cache.plan(pml).tokens)
        assert markup.from_template == (cache.model.chat_template() is not None)
        tail = markup.suffix["user"] + markup.generation_prompt
        if markup.from_template:  # control tokens have no text: compare tokens
            tail_tokens = cache.model.tokenize(tail, special=True)
            assert tokens[-len(tail_tokens):] == tail_tokens
        else:
            assert cache.model.detokenize(tokens).endswith(tail)

        body = {"schema": "c", "max_tokens": 12, "messages": [{"role": "user", "content": f"<doc/> {QUESTION}"}]}
        with ServerThread(cache) as server, httpx.Client(base_url=server.base_url, timeout=120) as http:
            cached = http.post("/v1/chat/completions", json=body).json()
            baseline = http.post("/v1/chat/completions", json=body | {"use_cache": False}).json()
    finally:
        cache.close()
    assert cached["choices"][0]["message"]["content"] == expected.text
    assert cached["usage"]["cached_tokens"] == expected.cached_tokens > 0
    assert baseline["choices"][0]["message"]["content"] == full.text
    assert baseline["usage"]["cached_tokens"] == 0
    assert expected.token_ids
