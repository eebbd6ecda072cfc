"""Cached equals fresh where the math says it must: a module at its real position, with its real context.

Comparisons use like cell layouts (a fresh context for the baseline: attention sums cells in slot order,
README "Same tokens, same answer") and like batches: the baseline computes the prompt's tokens in the
batches the cache computed them in (tests.conftest.batched_prefill_logits says why).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import batched_prefill_logits, prefill_logits
from tests.engine.conftest import EVERY_MODEL, model_path


@pytest.fixture(scope="module", params=EVERY_MODEL)
def engine_model(request, tiny_model_path):
    """Returns the path of the model an exactness test runs on: every installed one, the 1.5B included.

    The rest of the engine suite leaves the 1.5B to `-m slow`; these six tests take about a minute on it.
    """
    return model_path(request.param, tiny_model_path)

DOC = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, "
       "polished the great lens and wrote the weather into a leather book.")
PLAIN_SCHEMA = f'<schema name="s"><module name="doc">{DOC}</module><module name="other">Unrelated words.</module></schema>'
CHAT_SCHEMA = (f'<schema name="c"><system>You answer briefly.</system><user><module name="doc">{DOC}</module>'
               '</user></schema>')


def test_module_at_position_zero_gives_the_full_prefill_logits(make_cache):
    prompt = '<prompt schema="s"><doc/> What did the keeper polish?</prompt>'
    cache = make_cache()
    cached = prefill_logits(cache, PLAIN_SCHEMA, prompt, use_cache=True)
    doc = cache.schemas.layout("s").modules["doc"]
    baseline = batched_prefill_logits(make_cache(), PLAIN_SCHEMA, prompt, [doc.start, doc.end])
    assert np.abs(cached - baseline).max() == 0.0


def test_module_only_prompt_matches_the_full_prefill(make_cache, make_engine):
    # Every token is cached, so the last one is recomputed alone to get logits: exactly a full
    # prefill whose last token is then computed again alone. Against the one-batch prefill, the
    # one-token kernel rounds otherwise (~1e-6 on the tiny model, 0.5 on Qwen2.5-1.5B): same greedy token.
    prompt = '<prompt schema="s"><doc/></prompt>'
    cached = prefill_logits(make_cache(), PLAIN_SCHEMA, prompt, use_cache=True)
    fresh = make_engine()  # a fresh library context, as a new cache's (tests/engine/machinery.py Engine)
    tokens = list(fresh.plan(fresh.layout(PLAIN_SCHEMA), prompt).tokens)
    n, seq = len(tokens), fresh.roles.slots[0]
    fresh.ctx.decode(tokens, range(n), seq, logits_last=False)
    fresh.ctx.seq_rm(seq, n - 1, n)
    fresh.ctx.decode(tokens[-1:], [n - 1], seq)
    assert np.abs(cached - fresh.ctx.logits()).max() == 0.0
    fresh.ctx.seq_rm(seq)
    assert cached.argmax() == prefill_logits(make_cache(), PLAIN_SCHEMA, prompt, use_cache=False).argmax()


def test_module_at_position_zero_gives_the_baseline_greedy_tokens(make_cache):
    prompt = '<prompt schema="s"><doc/> What did the keeper polish?</prompt>'
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(PLAIN_SCHEMA)
    fresh.load_schema(PLAIN_SCHEMA, encode=False)
    cached = cache.generate(prompt, max_tokens=12)
    baseline = fresh.generate(prompt, max_tokens=12, use_cache=False)
    assert cached.token_ids == baseline.token_ids and cached.finish_reason == baseline.finish_reason
    assert len(cached.token_ids) == 12 or cached.finish_reason == "stop"  # SmolLM2 ends this text at once
    assert cached.cached_tokens > 0 and baseline.cached_tokens == 0


def test_module_after_the_preamble_is_exact_in_preamble_mode(make_cache):
    prompt = '<prompt schema="c"><doc/><user>What did the keeper polish?</user></prompt>'
    cache = make_cache()
    cached = prefill_logits(cache, CHAT_SCHEMA, prompt, use_cache=True)
    doc = cache.schemas.layout("c").modules["doc"]
    baseline = batched_prefill_logits(make_cache(), CHAT_SCHEMA, prompt, [doc.start, doc.end])
    assert np.abs(cached - baseline).max() == 0.0


def test_independent_mode_differs_from_the_full_prefill_after_a_preamble(make_cache):
    # The module no longer sees the system message, so its cells (and the logits) change.
    prompt = '<prompt schema="c"><doc/><user>What did the keeper polish?</user></prompt>'
    cached = prefill_logits(make_cache(encoding="independent"), CHAT_SCHEMA, prompt, use_cache=True)
    baseline = prefill_logits(make_cache(), CHAT_SCHEMA, prompt, use_cache=False)
    assert np.abs(cached - baseline).max() > 0.0


def test_baseline_in_the_same_context_matches_a_fresh_one(make_cache):
    # With module cells resident elsewhere in the cache, the baseline must still be a plain prefill.
    prompt = '<prompt schema="s"><doc/> What did the keeper polish?</prompt>'
    busy = make_cache()
    busy.load_schema(PLAIN_SCHEMA)
    in_busy = busy.generate(prompt, max_tokens=8, use_cache=False)
    fresh = make_cache()
    fresh.load_schema(PLAIN_SCHEMA, encode=False)
    assert in_busy.token_ids == fresh.generate(prompt, max_tokens=8, use_cache=False).token_ids
