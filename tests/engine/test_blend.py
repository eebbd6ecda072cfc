"""Recompute by deviation ("select:"): the probe's layer values, which cells it picks, and exact assembly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pc_cpu.engine.recompute.blend import batches, contiguous_runs, deviation, runs_by_module
from pc_cpu.engine.recompute.probe import PROBE_LAYERS, Probe
from pc_cpu.errors import PromptCacheError
from pc_cpu.kvstate import state_blob
from tests.engine.test_recompute import DOCS, GAP_FREE
from tests.tiny_gguf import write_tiny_llama_gguf


# --- pure parts --------------------------------------------------------------------------------

@given(st.sets(st.integers(0, 200), max_size=60))
def test_runs_group_adjacent_positions(positions):
    runs = contiguous_runs(sorted(positions))
    assert [p for a, b in runs for p in range(a, b)] == sorted(positions)
    assert all(b2 > a2 > b for (a, b), (a2, b2) in zip(runs, runs[1:]))  # separated by at least one position


@given(st.sets(st.integers(0, 300), max_size=80), st.integers(1, 8), st.integers(1, 40))
def test_batches_respect_sequence_and_size_limits(positions, seqs, n_batch):
    packed = batches(contiguous_runs(sorted(positions)), seqs, n_batch)
    assert [p for batch in packed for a, b in batch for p in range(a, b)] == sorted(positions)
    assert all(len(batch) <= seqs and sum(b - a for a, b in batch) <= n_batch for batch in packed)


def test_runs_are_cut_at_module_boundaries_in_position_order():
    from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan

    ops = (CopyCells("#root", 0, (1, 2)), CopyCells("a", 2, (3,) * 4), CopyCells("b", 6, (4,) * 4),
           DecodeTokens(10, (5,), "text"))
    plan = Plan("s", ops, ("#root", "a", "b"))
    assert runs_by_module([(3, 4), (5, 8), (9, 10)], plan) == [[(3, 4), (5, 6)], [(6, 8), (9, 10)]]
    assert runs_by_module([(6, 7)], plan) == [[(6, 7)]]  # a module with nothing chosen has no batch


def test_deviation_is_the_squared_k_and_v_distance_by_position():
    cached = (np.array([5, 3, 4]), np.array([[1.0], [0.0], [2.0]]), np.array([[0.0], [0.0], [1.0]]))
    full = (np.array([3, 4, 5]), np.array([[0.0], [0.0], [0.0]]), np.array([[3.0], [1.0], [0.0]]))
    assert deviation(cached, full, np.array([3, 4, 5])).tolist() == [9.0, 4.0, 1.0]
    with pytest.raises(PromptCacheError, match="positions"):
        deviation(cached, full, np.array([6]))


# --- the probe ----------------------------------------------------------------------------------

@pytest.mark.tiny_only  # it pins a 4-layer tiny model: one run, not one per engine model
def test_the_cut_down_probe_computes_the_full_models_early_layer(tmp_path, make_cache):
    # A 4-layer model cut to PROBE_LAYERS must give the same layer-1 K/V as the whole model.
    deep = write_tiny_llama_gguf(tmp_path / "deep.gguf", n_layer=4)
    cache = make_cache(deep)
    cache.load_schema(DOCS)
    plan = cache.plan(GAP_FREE, recompute="all")
    with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        pos, k, v = state_blob.layer_kv(prefilled.cells(), PROBE_LAYERS - 1)
    probe = Probe(cache.model, n_ctx=1024, threads=2, flash_attn=None, directory=tmp_path)
    try:
        assert probe.model.info.n_layer == PROBE_LAYERS
        ppos, pk, pv = probe.kv(plan)
    finally:
        probe.close()
    order, porder = np.argsort(pos), np.argsort(ppos)
    assert pos[order].tolist() == ppos[porder].tolist() == list(plan.positions)
    assert np.allclose(k[order], pk[porder], atol=1e-2) and np.allclose(v[order], pv[porder], atol=1e-2)


def test_layer_values_read_the_same_with_v_transposed_or_not(make_cache):
    values = []
    for flash in (True, False):
        cache = make_cache(flash_attn=flash)
        cache.load_schema(DOCS)
        with cache.workbench.prefilled(cache.plan(GAP_FREE), use_cache=False) as prefilled:
            values.append(state_blob.layer_kv(prefilled.cells(), 1))
    (p1, k1, v1), (p2, k2, v2) = values
    assert p1.tolist() == p2.tolist()
    # Flash attention changes layer 0's rounding, so layer 1's values move a little on real models;
    # a V read in the wrong layout would not be close at all.
    for a, b in ((k1, k2), (v1, v2)):
        assert np.linalg.norm(a - b) < 0.05 * np.linalg.norm(a)  # measured: up to 2.6% (Gemma 3)


# --- assembly -----------------------------------------------------------------------------------

def test_selecting_everything_gives_the_full_prefill_answer(make_cache):
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(DOCS)
    fresh.load_schema(DOCS)
    plan = cache.plan(GAP_FREE, recompute="select:100%")
    module_cells = sum(len(op.tokens) for op in plan.ops if getattr(op, "module", "#root") != "#root")
    assert plan.selected_tokens == module_cells > 0
    got = cache.generate(GAP_FREE, max_tokens=8, recompute="select:100%")
    assert len(cache.workbench.blender.last_selected) == plan.selected_tokens
    assert got.token_ids == fresh.generate(GAP_FREE, max_tokens=8, use_cache=False).token_ids


def test_selecting_everything_module_by_module_gives_the_full_prefill_answer(make_cache):
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(DOCS)
    fresh.load_schema(DOCS)
    got = cache.generate(GAP_FREE, max_tokens=8, recompute="select:100%@module")
    assert got.token_ids == fresh.generate(GAP_FREE, max_tokens=8, use_cache=False).token_ids


def test_module_by_module_refresh_recomputes_the_same_cells(make_cache):
    cache = make_cache()
    cache.load_schema(DOCS)
    chosen = {}
    for policy in ("select:40%", "select:40%@module"):
        plan = cache.plan(GAP_FREE, recompute=policy)
        with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
            found = prefilled.positions()
        assert found == list(plan.positions)  # every cell in place, none doubled
        chosen[policy] = cache.workbench.blender.last_selected
    assert chosen["select:40%"] == chosen["select:40%@module"] and chosen["select:40%"]


def test_selection_recomputes_the_most_deviating_cells_in_place(make_cache):
    cache = make_cache()
    cache.load_schema(DOCS)
    plan = cache.plan(GAP_FREE, recompute="select:30%")
    with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        found = prefilled.positions()
    blender = cache.workbench.blender
    assert found == list(plan.positions)
    assert len(blender.last_selected) == plan.selected_tokens > 0
    # The chosen ones are the largest deviations between the cached cells and the probe's prefill.
    head = type(plan)(plan.schema, plan.ops[:-1], plan.modules)
    # The probe's last layer, in the cache that holds it (on Gemma 3 the window layers' cache).
    section, index = blender.probe.layer
    with cache.workbench.prefilled(type(plan)(plan.schema, plan.ops, plan.modules), use_cache=True) as prefilled:  # select 0
        cached = state_blob.layer_kv(prefilled.cells(), index, section=section)
    candidates = np.array([p for op in head.ops if getattr(op, "module", "#root") != "#root"
                           for p in range(op.start, op.end)])
    scores = deviation(cached, blender.probe.kv(head), candidates)
    threshold = np.sort(scores)[-plan.selected_tokens]
    assert all(scores[list(candidates).index(p)] >= threshold - 1e-6 for p in blender.last_selected)


def test_select_zero_is_the_cached_answer(make_cache):
    cache = make_cache()
    cache.load_schema(DOCS)
    assert cache.plan(GAP_FREE, recompute="select:0%").selected_tokens == 0
    assert (cache.generate(GAP_FREE, max_tokens=8, recompute="select:0%").token_ids
            == cache.generate(GAP_FREE, max_tokens=8).token_ids)


@pytest.mark.tiny_only  # a real model rounds a token by the batch it is in, and that batch is other prompts
def test_concurrent_prompts_with_selection_get_their_single_request_answers(make_engine):
    # The machinery as a PromptCache builds it (tests/engine/machinery.py Engine), its scheduler running the prompts.
    from tests.engine.test_scheduler import QUESTIONS, SCHEMA, prompt, run_in_threads

    engine = make_engine(parallel=4)
    layout = engine.load(SCHEMA)
    policies = ["select:30%", "tail:4", "select:60%", "0"] * 2
    work = list(zip(QUESTIONS, policies))

    def answer(question: str, policy: str) -> list[int]:
        return engine.generate(layout, prompt(question), max_tokens=12, recompute=policy).token_ids

    alone = [answer(q, p) for q, p in work]
    together = run_in_threads(lambda w: answer(*w), work)
    assert together == alone
    # Every borrowed sequence was handed back empty: the next prompt finds them idle again.
    assert all(engine.ctx.seq_pos_max(seq) == -1 for seq in engine.resident.idle_seqs())
