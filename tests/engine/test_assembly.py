"""Assembly puts every cell where the layout says, for unions, nesting, params and gaps."""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.errors import (ArgumentTooLongError, ContextBeyondTrainingError, ContextOverflowError, PromptCacheError,
                           SequenceBudgetError)

SCHEMA = """<schema name="trip">
  <system>You plan trips.</system>
  <module name="plan">Plan a trip of <param name="days" len="6"/> in
    <union name="city">
      <module name="paris">Paris, with its museums, cafes and the river Seine.</module>
      <module name="tokyo">Tokyo.</module>
    </union>
    <module name="budget">Budget: <param name="amount" len="4"/><param name="currency" len="3"/> total.</module>
  </module>
  <module name="food">Food tips for every city and season.</module>
</schema>"""

PROMPTS = {
    "union-long": '<prompt schema="trip"><plan days="3 days"><paris/></plan><user>Go!</user></prompt>',
    "union-short-gap": '<prompt schema="trip"><plan days="3 days"><tokyo/></plan><food/><user>Go!</user></prompt>',
    "nested-params": ('<prompt schema="trip"><plan days="ten full days"><tokyo/><budget amount="500" '
                      'currency="EUR"/></plan><user>Go!</user></prompt>'),
    "param-after-short-arg": ('<prompt schema="trip"><plan days="2"><budget amount="5" currency="US dollars"/>'
                              '</plan><user>Go!</user></prompt>'),
    "modules-left-out": '<prompt schema="trip"><food/><user>Go!</user></prompt>',
}


def assembled_positions(cache, prompt):
    plan = cache.plan(prompt)
    with cache.workbench.prefilled(plan, use_cache=True) as assembled:
        return plan, assembled.positions(), assembled.logits()


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_assembled_cells_sit_at_the_plan_positions(make_cache, name):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    plan, found, logits = assembled_positions(cache, PROMPTS[name])
    assert found == list(plan.positions)
    assert np.isfinite(logits).all()


def test_plan_positions_follow_the_layout(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    layout = cache.schemas.layout("trip")
    plan = cache.plan(PROMPTS["union-short-gap"])
    food, tokyo = layout.modules["food"], layout.modules["tokyo"]
    positions = set(plan.positions)
    assert set(range(food.start, food.end)) <= positions
    assert set(range(tokyo.start, tokyo.end)) <= positions
    # The gap the union reserves for its longer member holds no cell.
    paris = layout.modules["paris"]
    assert not positions & set(range(tokyo.end, paris.end))


def test_argument_is_computed_at_its_slot_even_after_a_gap(make_cache):
    # "amount" takes 1 of 4 positions, so "currency" starts after a gap: it is computed
    # after the last cell, then moved (K re-rotated) into its slot.
    cache = make_cache()
    cache.load_schema(SCHEMA)
    plan, found, _ = assembled_positions(cache, PROMPTS["param-after-short-arg"])
    slot = cache.schemas.layout("trip").modules["budget"].params()["currency"]
    assert slot.start in found
    assert found == list(plan.positions)


def test_exact_length_argument_fills_its_param(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    slot = cache.schemas.layout("trip").modules["budget"].params()["amount"]
    amount = cache.model.detokenize([cache.model.tokenize(" one", special=False)[0]] * len(slot.tokens))
    assert len(cache.model.tokenize(amount, special=False)) == len(slot.tokens)
    prompt = (f'<prompt schema="trip"><plan days="2"><budget amount="{amount}" currency="EUR"/></plan>'
              '<user>Go!</user></prompt>')
    plan, found, _ = assembled_positions(cache, prompt)
    assert set(range(slot.start, slot.end)) <= set(found)


def test_too_long_argument_is_an_error_before_any_work(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    with pytest.raises(ArgumentTooLongError, match="param 'amount' of module 'budget'.*len=4"):
        cache.generate('<prompt schema="trip"><plan days="2"><budget amount="one two three four five six" '
                       'currency="EUR"/></plan></prompt>')


def test_sequence_budget_evicts_and_is_a_clear_error_when_one_prompt_needs_more(make_cache):
    members = "".join(f'<module name="m{i}">member {i}</module>' for i in range(6))
    cache = make_cache(n_seq_max=5, parallel=1, n_ctx=256)  # 1 prompt slot, scratch, pin and hold: 1 library sequence
    cache.load_schema(f'<schema name="u"><union>{members}</union></schema>')  # members take turns
    assert cache.generate('<prompt schema="u"><m0/> and</prompt>', max_tokens=1).tiers["m0"] == "ram"
    # A folded schema's modules share positions: a prompt importing three needs three sequences at once.
    modules = "".join(f"<module name=\"d{i}\">" + f"document {i} " * 8 + "</module>" for i in range(12))
    cache.load_schema(f'<schema name="f">{modules}</schema>')
    assert cache.schemas.layout("f").folded
    with pytest.raises(SequenceBudgetError, match="raise n_seq_max"):
        cache.generate('<prompt schema="f"><d0/><d1/><d2/> and</prompt>', max_tokens=1)


def test_prompt_longer_than_the_context_is_a_clear_error(make_cache):
    cache = make_cache(n_ctx=128)
    cache.load_schema('<schema name="s"><module name="a">short text</module></schema>')
    with pytest.raises(ContextOverflowError, match="raise n_ctx"):
        cache.generate('<prompt schema="s"><a/>' + "word " * 300 + "</prompt>")


def test_schema_longer_than_the_context_is_a_clear_error(make_cache):
    cache = make_cache(n_ctx=128)
    with pytest.raises(ContextOverflowError, match="schema 's' has a module that ends at position"):
        cache.load_schema('<schema name="s"><module name="a">' + "word " * 300 + "</module></schema>")


def test_module_cells_are_shared_not_copied(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    before = cache.schemas.resident_cells
    for _ in range(3):
        cache.generate(PROMPTS["union-long"], max_tokens=2)
    assert cache.schemas.resident_cells == before == cache.schemas.layout("trip").cached_cells


def test_reloading_a_changed_schema_replaces_its_modules(make_cache):
    cache = make_cache()
    cache.load_schema('<schema name="s"><module name="a">first version</module></schema>')
    cache.load_schema('<schema name="s"><module name="b">second version, longer text</module></schema>')
    assert cache.schemas.resident_cells == cache.schemas.layout("s").cached_cells
    assert "b" in cache.schemas.layout("s").modules and "a" not in cache.schemas.layout("s").modules


@pytest.mark.tiny_only  # one model is enough: the check reads the GGUF's training context
def test_a_context_beyond_the_models_training_context_is_refused(make_cache):
    trained = make_cache().model.info.n_ctx_train
    assert trained > 0
    with pytest.raises(ContextBeyondTrainingError, match=rf"n_ctx={trained + 1:,} is more than the {trained:,} "
                                                          rf"positions model '.*' was trained on.*--n-ctx {trained}"):
        make_cache(n_ctx=trained + 1)
    assert make_cache(n_ctx=trained, parallel=1).n_ctx >= trained


def test_parallel_leaves_a_sequence_for_modules(make_cache):
    with pytest.raises(PromptCacheError, match=r"parallel=5: must be 1..n_seq_max-4 \(4\); three sequences are"):
        make_cache(n_seq_max=8, parallel=5)
    assert SequenceRoles.for_contexts(4, 8).hold == 7  # the roles of the cache below: one library sequence
    cache = make_cache(n_seq_max=8, parallel=4)  # prompts 0-3, scratch 4, pin 5, library 6, hold 7
    cache.load_schema(SCHEMA)
    assert cache.generate('<prompt schema="trip"><plan days="2"/></prompt>', max_tokens=2).modules
