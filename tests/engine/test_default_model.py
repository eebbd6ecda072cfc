"""Short checks on the real default model (SmolLM2-135M): behaviour, not one quantization's answers.

A 135M Q4 model flips near-tied greedy tokens when its cells sit in other KV slots, so these tests
pin no answer text. They check that answers are text, that a prompt run twice answers the same
tokens, how cached and baseline runs of the same tokens relate, and that where the math says so
(a module computed after the same text as in a full prefill) the cached run is the full prefill.
"""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.demo import QUESTIONS, demo_prompt, demo_schema
from tests.conftest import prefill_logits, smollm2_path

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
    assert first.modules == ["style", doc] and set(second.tiers.values()) == {"context"}


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


def test_module_right_after_the_system_message_gives_the_full_prefill(make_cache):
    cache, fresh = make_cache(smollm2_path()), make_cache(smollm2_path())
    cached = prefill_logits(cache, EXACT_SCHEMA, EXACT_PROMPT, use_cache=True)
    baseline = prefill_logits(fresh, EXACT_SCHEMA, EXACT_PROMPT, use_cache=False)  # schema not encoded there
    assert np.abs(cached - baseline).max() == 0.0
    answer = cache.generate(EXACT_PROMPT, max_tokens=16)
    assert_answered(answer, 16)
    assert answer.cached_tokens > 0
    assert answer.token_ids == fresh.generate(EXACT_PROMPT, max_tokens=16, use_cache=False).token_ids
