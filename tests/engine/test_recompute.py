"""Recomputation in assembly: all = the full prefill, 0 = the cached answer, any mix assembles cleanly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pc_cpu.pml.plan import CopyCells
from tests.conftest import batched_prefill_logits
from tests.engine.test_assembly import PROMPTS, SCHEMA

DOCS = ('<schema name="d"><module name="a">The keeper wrote the weather in a book every evening.</module>'
        '<module name="b">The ferry to Skerra leaves twice a day and takes an hour.</module></schema>')
GAP_FREE = '<prompt schema="d"><a/><b/> How often does the ferry leave?</prompt>'


def test_recomputing_everything_gives_the_full_prefill_logits(make_cache):
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(DOCS)
    plan = cache.plan(GAP_FREE, recompute="all")
    copied = [op for op in plan.ops if isinstance(op, CopyCells)]
    assert all(op.module == "#root" for op in copied)  # only the preamble (BOS, where the model has one) is cached
    with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        recomputed = prefilled.logits()
    baseline = batched_prefill_logits(fresh, DOCS, GAP_FREE, [op.start + len(op.tokens) for op in copied])
    assert np.abs(recomputed - baseline).max() == 0.0
    assert (cache.generate(GAP_FREE, max_tokens=8, recompute="all").token_ids
            == fresh.generate(GAP_FREE, max_tokens=8, use_cache=False).token_ids)


def test_recomputing_nothing_is_the_cached_answer(make_cache):
    cache = make_cache()
    cache.load_schema(DOCS)
    assert (cache.generate(GAP_FREE, max_tokens=8, recompute="0").token_ids
            == cache.generate(GAP_FREE, max_tokens=8).token_ids)


def test_recomputing_a_tail_changes_the_answer_toward_the_full_prefill(make_cache):
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(DOCS)
    # "all" computes every module token again, in one batch after the restored preamble, and the
    # prompt's text in a batch of its own: the full prefill computed in those batches (kernels round
    # a token by its batch on some models: tests/conftest.py, batched_prefill_logits).
    preamble_end = cache.schemas.layout("d").preamble_end
    baseline = batched_prefill_logits(fresh, DOCS, GAP_FREE, [preamble_end])
    distances = []
    for policy in ("0", "tail:4", "50%", "all"):
        plan = cache.plan(GAP_FREE, recompute=policy)
        with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
            distances.append(float(np.abs(prefilled.logits() - baseline).max()))
    assert distances[-1] == 0.0 and distances[0] > 0.0


POLICIES = st.one_of(st.just("0"), st.just("all"), st.just("relevant:1"), st.builds(lambda h, t: f"head:{h},tail:{t}",
                                                             st.integers(0, 6), st.integers(0, 6)),
                     st.builds(lambda f: f"{f}%", st.integers(0, 100)),
                     st.builds(lambda t, f: f"tail:{t},select:{f}%", st.integers(0, 6), st.integers(1, 100)))


@pytest.fixture(scope="module")
def trip_cache(tiny_model_path):
    from pc_cpu import PromptCache

    cache = PromptCache(tiny_model_path, n_ctx=1024, threads=2, n_seq_max=16)
    cache.load_schema(SCHEMA)
    yield cache
    cache.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=POLICIES, name=st.sampled_from(sorted(PROMPTS)))
def test_any_policy_assembles_at_the_layout_positions(trip_cache, policy, name):
    # Unions, nested modules, params and gaps: recomputed tokens never break llama.cpp's position rule.
    plan = trip_cache.plan(PROMPTS[name], recompute=policy)
    with trip_cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        found, logits = prefilled.positions(), prefilled.logits()
    assert found == list(plan.positions)
    assert np.isfinite(logits).all()
