"""Short checks on the installed packaged models: behaviour and sensible answers, not one quantization's tokens.

A small Q4 model flips near-tied greedy tokens when a computation changes, so no answer text is pinned
beyond the facts the documents state. Where the math says so (a module computed after the same text as
in a full prefill) the cached run is the full prefill.
"""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.demo import QUESTIONS, demo_prompt, demo_schema
from tests.conftest import prefill_logits

EXACT_SCHEMA = ('<schema name="exact"><system>You are a helpful assistant.</system><user><module name="doc">'
                'The capital of the fictional country of Norland is Vesterhavn, a port city of 80,000 people.'
                '</module></user></schema>')
EXACT_PROMPT = '<prompt schema="exact"><doc/><user>What is the capital of Norland?</user></prompt>'


def assert_answered(result, max_tokens: int) -> None:
    """Fails unless `result` is a non-empty answer of printable text within `max_tokens`."""
    assert 0 < len(result.token_ids) <= max_tokens
    assert result.text.strip(), result.token_ids
    assert all(c.isprintable() or c in "\n\t" for c in result.text), repr(result.text)
    assert result.finish_reason == ("length" if len(result.token_ids) == max_tokens else "stop")


@pytest.mark.parametrize("doc, question", QUESTIONS, ids=[doc for doc, _ in QUESTIONS])
def test_cached_demo_answers_are_text_and_repeat_exactly(smollm2_cache, doc, question):
    smollm2_cache.load_schema(demo_schema())
    first, second = (smollm2_cache.generate(demo_prompt(doc, question), max_tokens=24) for _ in range(2))
    assert_answered(first, 24)
    assert second.token_ids == first.token_ids  # nothing changed between the runs
    assert first.modules == [doc] and set(second.tiers.values()) == {"context"}


def test_baseline_reads_the_cached_runs_tokens_computing_all_of_them_and_repeats_exactly(smollm2_cache):
    smollm2_cache.load_schema(demo_schema())
    prompt = demo_prompt(*QUESTIONS[0])
    cached = smollm2_cache.generate(prompt, max_tokens=16)
    first, second = (smollm2_cache.generate(prompt, max_tokens=16, use_cache=False) for _ in range(2))
    assert_answered(first, 16)
    assert second.token_ids == first.token_ids
    assert cached.prompt_tokens == first.prompt_tokens == len(smollm2_cache.plan(prompt).tokens)
    assert cached.cached_tokens + cached.uncached_tokens == cached.prompt_tokens
    assert cached.cached_tokens > 250 and cached.uncached_tokens < 40  # the document comes from the cache
    assert first.cached_tokens == 0 and first.uncached_tokens == first.prompt_tokens


def test_module_right_after_the_system_message_gives_the_full_prefill(make_smollm2_cache):
    cache, fresh = make_smollm2_cache(), make_smollm2_cache()
    cached = prefill_logits(cache, EXACT_SCHEMA, EXACT_PROMPT, use_cache=True)
    baseline = prefill_logits(fresh, EXACT_SCHEMA, EXACT_PROMPT, use_cache=False)  # schema not encoded there
    assert np.abs(cached - baseline).max() == 0.0
    answer = cache.generate(EXACT_PROMPT, max_tokens=16)
    assert_answered(answer, 16)
    assert answer.cached_tokens > 0
    assert answer.token_ids == fresh.generate(EXACT_PROMPT, max_tokens=16, use_cache=False).token_ids


def test_cached_demo_answers_come_from_the_documents(packaged_cache):
    packaged_cache.load_schema(demo_schema())
    doc, question = QUESTIONS[1]  # the Calder Light: automated in 1987
    cached = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24)
    baseline = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24, use_cache=False)
    assert "1987" in cached.text and "1987" in baseline.text
    assert cached.cached_tokens > 250 and cached.uncached_tokens < 40


def test_the_demos_first_answers_are_the_full_prefills(packaged_cache):
    # Each document sits right after the system message: its cells are the full prefill's, computed in
    # the same calls (Plan.calls), so the first answers a newcomer reads agree on any CPU.
    packaged_cache.load_schema(demo_schema())
    for doc, question in QUESTIONS:
        cached = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24)
        baseline = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24, use_cache=False)
        assert cached.cached_tokens > 250 and cached.token_ids == baseline.token_ids, doc


def test_each_union_member_answers_its_own_question(packaged_cache):
    packaged_cache.load_schema(demo_schema())
    # Not the observatory's 41,000: on SmolLM2 it is a near tie with "4,000" that rounding decides
    # (cached and full prefill alike, since they compute the same cells in the same calls).
    expected = {"harbor": "1987", "railway": "212"}
    for doc, question in QUESTIONS:
        if doc in expected:
            answer = packaged_cache.generate(demo_prompt(doc, question), max_tokens=32).text
            assert expected[doc] in answer, (doc, answer)


def test_module_right_after_the_system_message_matches_the_baseline_tokens(packaged_cache):
    schema = ('<schema name="exact"><system>You are a helpful assistant.</system><user><module name="doc">'
              'The capital of the fictional country of Norland is Vesterhavn, a port city of 80,000 people.'
              '</module></user></schema>')
    packaged_cache.load_schema(schema)
    prompt = '<prompt schema="exact"><doc/><user>What is the capital of Norland?</user></prompt>'
    cached = packaged_cache.generate(prompt, max_tokens=16)
    baseline = packaged_cache.generate(prompt, max_tokens=16, use_cache=False)
    assert cached.token_ids == baseline.token_ids
    assert "Vesterhavn" in cached.text
