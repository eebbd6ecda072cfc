"""GenerationOptions: one typed value for the options `generate`, `stream`, `ask` and `stream_ask` take as keywords."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.options import GenerationOptions

SCHEMA = '<schema name="s"><module name="doc">A short note about boats and the sea.</module></schema>'
PROMPT = '<prompt schema="s"><doc/> Tell me more:</prompt>'


def test_keywords_override_the_options_given_and_unset_ones_keep_their_defaults():
    base = GenerationOptions(max_tokens=5, temperature=0.7, stop=["."])
    merged = GenerationOptions.of(base, {"seed": 3, "temperature": 0.0}, method="generate")
    assert merged == GenerationOptions(max_tokens=5, temperature=0.0, seed=3, stop=(".",))
    assert GenerationOptions.of(None, {}, method="generate") == GenerationOptions()


def test_an_unknown_keyword_is_refused_by_name():
    with pytest.raises(TypeError, match="'max_token'.*max_tokens"):
        GenerationOptions.of(None, {"max_token": 3}, method="generate")


def test_one_stop_string_is_one_stop_text_not_one_per_character():
    assert GenerationOptions(stop="\n\n").stop == ("\n\n",)
    assert GenerationOptions(stop=["a", "b"]).stop == ("a", "b")


@pytest.mark.parametrize("max_tokens", [0, -1, 2.5, True])
def test_max_tokens_must_be_a_positive_count(max_tokens):
    with pytest.raises(PromptCacheError, match="max_tokens"):
        GenerationOptions(max_tokens=max_tokens)


@pytest.fixture
def cache(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    return cache


def test_an_options_value_answers_as_the_same_keywords_do(cache):
    by_keywords = cache.generate(PROMPT, max_tokens=6, temperature=0.8, seed=7)
    options = GenerationOptions(max_tokens=6, temperature=0.8, seed=7)
    assert cache.generate(PROMPT, options).token_ids == by_keywords.token_ids
    assert cache.generate(PROMPT, GenerationOptions(max_tokens=6, seed=7), temperature=0.8).token_ids == \
        by_keywords.token_ids
    assert "".join(cache.stream(PROMPT, options)) == by_keywords.text


def test_a_plan_from_plan_answers_as_its_prompt_does_without_planning_again(cache, monkeypatch):
    import pc_cpu.cache

    expected = cache.generate(PROMPT, max_tokens=6, recompute="tail:2")
    plan = cache.plan(PROMPT, recompute="tail:2")
    monkeypatch.setattr(pc_cpu.cache, "build_plan", lambda *a, **k: pytest.fail("planned again"))
    result = cache.generate(plan, max_tokens=6)
    assert (result.token_ids, result.cached_tokens, result.uncached_tokens) == \
        (expected.token_ids, expected.cached_tokens, expected.uncached_tokens)


def test_a_plan_with_a_recompute_policy_again_is_refused(cache):
    plan = cache.plan(PROMPT)
    with pytest.raises(PromptCacheError, match="recompute.*plan"):
        cache.generate(plan, recompute="tail:2")


def test_a_plan_of_a_schema_unloaded_since_is_refused_by_name(cache):
    plan = cache.plan(PROMPT)
    cache.unload_schema("s")
    with pytest.raises(PromptCacheError, match="schema 's' is not loaded"):
        cache.generate(plan)
