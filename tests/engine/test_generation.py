"""Generation: sampling options, stop conditions and streaming."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError

SCHEMA = '<schema name="s"><module name="doc">A short note about boats and the sea.</module></schema>'
PROMPT = '<prompt schema="s"><doc/> Tell me more:</prompt>'


@pytest.fixture
def cache(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    return cache


def test_stream_yields_the_text_generate_returns(cache):
    stream = cache.stream(PROMPT, max_tokens=10)
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text == cache.generate(PROMPT, max_tokens=10).text


def test_max_tokens_bounds_the_output(cache):
    result = cache.generate(PROMPT, max_tokens=5)
    assert len(result.token_ids) == 5 and result.finish_reason == "length"


def test_stop_string_ends_generation_and_is_not_returned(cache):
    full = cache.generate(PROMPT, max_tokens=20).text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop
    result = cache.generate(PROMPT, max_tokens=20, stop=[stop])
    assert result.finish_reason == "stop"
    assert result.text == full[: full.find(stop)]


def test_same_seed_gives_the_same_sample_and_another_seed_can_differ(cache):
    runs = [cache.generate(PROMPT, max_tokens=12, temperature=1.5, seed=s).token_ids for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert runs[2] != runs[0] or runs[3] != runs[0]


def test_top_k_one_is_greedy(cache):
    greedy = cache.generate(PROMPT, max_tokens=8).token_ids
    assert cache.generate(PROMPT, max_tokens=8, temperature=0.8, top_k=1, seed=7).token_ids == greedy


@pytest.mark.parametrize("options, message", [
    ({"temperature": -1}, "temperature"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"temperature": float("inf")}, "temperature=inf"),
    ({"top_p": float("nan")}, "top_p=nan"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_sampling_options_are_clear_errors(cache, options, message):
    with pytest.raises(PromptCacheError, match=message):
        cache.generate(PROMPT, **options)


def test_result_counts_cached_and_uncached_tokens(cache):
    plan = cache.plan(PROMPT)
    result = cache.generate(PROMPT, max_tokens=3)
    assert (result.cached_tokens, result.uncached_tokens) == (plan.cached_tokens, plan.uncached_tokens)
    assert result.modules == ["doc"]
    assert 0 < result.ttft_ms <= result.total_ms
    baseline = cache.generate(PROMPT, max_tokens=3, use_cache=False)
    assert baseline.uncached_tokens == len(plan.tokens) and baseline.cached_tokens == 0
