"""PML prompts may import a schema's modules in any order: the modules are moved, back to back, in the order written."""

from __future__ import annotations

import numpy as np

from pc_cpu.pml.plan import CopyCells
from tests.conftest import prefill_logits

NOTES = {"a": "The red key opens the garden shed.", "b": "The blue key opens the attic.",
         "c": "The green key opens the cellar door."}


def schema(name: str, order: str) -> str:
    modules = "".join(f'<module name="{m}">{NOTES[m]}</module>' for m in order)
    return f'<schema name="{name}"><system>Answer from the notes.</system><user>{modules}</user></schema>'


PROMPT = "<user>Which key opens the cellar?</user>"


def test_modules_written_out_of_order_are_moved_and_agree_with_modules_encoded_there(make_cache):
    # Schema "abc" imported as <c/><a/><b/> puts c, a and b back to back after the preamble: the
    # positions schema "cab" gives them. The moved cells differ from the
    # ones encoded there only by the F16 rounding of their re-rotation.
    cache = make_cache(store=False)
    packed = f'<prompt schema="abc"><c/><a/><b/>{PROMPT}</prompt>'
    in_place = f'<prompt schema="cab"><c/><a/><b/>{PROMPT}</prompt>'
    moved = prefill_logits(cache, schema("abc", "abc"), packed, use_cache=True)
    there = prefill_logits(cache, schema("cab", "cab"), in_place, use_cache=True)
    plan, plan_there = cache.plan(packed), cache.plan(in_place)
    assert plan.tokens == plan_there.tokens and plan.positions == plan_there.positions
    assert all(op.moved for op in plan.ops if isinstance(op, CopyCells) and op.module in "ca")
    assert not any(op.moved for op in plan_there.ops if isinstance(op, CopyCells))
    assert np.abs(moved - there).max() <= 0.05 * np.abs(there).max()
    # The library's own cells did not move: the schema-order prompt still gets exactly its cells.
    again = prefill_logits(cache, schema("abc", "abc"), f'<prompt schema="abc"><a/><c/>{PROMPT}</prompt>',
                           use_cache=True)
    fresh = make_cache(store=False)
    assert np.array_equal(again, prefill_logits(fresh, schema("abc", "abc"),
                                                f'<prompt schema="abc"><a/><c/>{PROMPT}</prompt>', use_cache=True))


def test_an_out_of_order_prompt_answers_and_reports_its_modules_in_the_written_order(make_cache):
    cache = make_cache(store=False)
    cache.load_schema(schema("abc", "abc"))
    result = cache.generate(f'<prompt schema="abc"><c/><b/>{PROMPT}</prompt>', max_tokens=4)
    baseline = cache.generate(f'<prompt schema="abc"><c/><b/>{PROMPT}</prompt>', max_tokens=4, use_cache=False)
    assert result.modules == baseline.modules == ["c", "b"]
    assert result.cached_tokens + result.uncached_tokens == baseline.uncached_tokens
    assert set(result.tiers.values()) == {"context"}
