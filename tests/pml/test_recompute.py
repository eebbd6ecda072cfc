"""Recompute policies: what they parse to, which positions they pick, and how the plan computes them."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError, SchemaError
from pc_cpu.pml.plan import CopyCells, DecodeTokens
from pc_cpu.pml.recompute import HEAD_SHARE, NO_RECOMPUTE, RecomputePolicy, parse_policy
from pc_cpu.pml.schema import parse_schema
from pc_cpu.pml.layout import build_layout
from pc_cpu.pml.plan import build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.roles import PLAIN_MARKUP
from tests.fake_tokenizer import WordTokenizer

SCHEMA = ('<schema name="r">Intro. <module name="a">one two three four five six seven eight nine ten</module>'
          '<module name="b">alpha beta gamma delta epsilon</module></schema>')
PROMPT = '<prompt schema="r"><a/><b/> Why?</prompt>'


@pytest.mark.parametrize("text, policy", [
    (None, NO_RECOMPUTE), ("0", NO_RECOMPUTE), ("none", NO_RECOMPUTE),
    ("head:8", RecomputePolicy(head=8)), ("tail:32", RecomputePolicy(tail=32)),
    ("head:8,tail:32", RecomputePolicy(8, 32)), ("10%", RecomputePolicy(fraction=0.1)),
    ("0.25", RecomputePolicy(fraction=0.25)), (0.5, RecomputePolicy(fraction=0.5)),
    ("all", RecomputePolicy(fraction=1.0)), ("select:15%", RecomputePolicy(select=0.15)),
    ("tail:8,select:0.1", RecomputePolicy(tail=8, select=0.1)), ("relevant:1", RecomputePolicy(relevant=1)),
    ("select:15%@module", RecomputePolicy(select=0.15, select_by_module=True)),
])
def test_policies_parse(text, policy):
    assert parse_policy(text) == policy


@pytest.mark.parametrize("text", ["head:x", "tail:-1", "150%", "sometimes", "1.5", "select:x", "select:150%", "relevant:one",
                                  "select:@module", "select:10%@mod"])
def test_bad_policies_name_the_valid_forms(text):
    with pytest.raises(PromptCacheError, match="recompute"):
        parse_policy(text)


def test_fraction_is_split_between_head_and_tail():
    head, tail = RecomputePolicy(fraction=0.2).split(100)
    assert (head, tail) == (round(20 * HEAD_SHARE), 20 - round(20 * HEAD_SHARE))
    assert RecomputePolicy(head=8, tail=8).split(10) == (8, 2)  # never more than the module has


def test_choose_picks_the_first_and_last_positions():
    positions = list(range(10, 20))
    assert RecomputePolicy(head=2, tail=3).choose(positions) == {10, 11, 17, 18, 19}
    assert RecomputePolicy().choose(positions) == frozenset()


@pytest.fixture
def tok():
    return WordTokenizer(bos=False)


def layout_of(schema, tok):
    return build_layout(parse_schema(schema), tok, PLAIN_MARKUP)


def plan_of(layout, prompt, tok, recompute=NO_RECOMPUTE):
    return build_plan(layout, parse_prompt(prompt), tok, PLAIN_MARKUP, recompute)


def test_tail_tokens_are_decoded_in_place_and_the_rest_is_shared(tok):
    layout = layout_of(SCHEMA, tok)
    plan = plan_of(layout, PROMPT, tok, recompute=parse_policy("tail:2"))
    a, b = layout.modules["a"], layout.modules["b"]
    decoded = [p for op in plan.ops if isinstance(op, DecodeTokens) for p in range(op.start, op.end)]
    assert {a.end - 2, a.end - 1, b.end - 2, b.end - 1} <= set(decoded)
    shared = {op.module: (op.start, op.end) for op in plan.ops if isinstance(op, CopyCells)}
    assert shared["a"] == (a.start, a.end - 2) and shared["b"] == (b.start, b.end - 2)
    assert list(plan.positions) == sorted(plan.positions)
    baseline_plan = plan_of(layout, PROMPT, tok)
    assert plan.tokens == baseline_plan.tokens  # the same tokens, only how their cells get there differs
    assert plan.cached_tokens == baseline_plan.cached_tokens - 4


def test_all_turns_every_module_token_into_one_decode_when_nothing_has_gaps(tok):
    plan = plan_of(layout_of(SCHEMA, tok), PROMPT, tok, recompute=parse_policy("all"))
    # The cached preamble, then every module token in one decode, then the prompt's own text.
    assert [type(op) for op in plan.ops] == [CopyCells, DecodeTokens, DecodeTokens]
    assert plan.ops[2].what == "prompt text"
    assert plan.ops[0].module == "#root"


def test_a_modules_own_policy_wins_over_the_calls(tok):
    schema = SCHEMA.replace('<module name="b">', '<module name="b" recompute="0">')
    plan = plan_of(layout_of(schema, tok), PROMPT, tok, recompute=parse_policy("tail:2"))
    b = layout_of(schema, tok).modules["b"]
    assert any(isinstance(op, CopyCells) and op.module == "b" and op.end == b.end for op in plan.ops)


def test_a_bad_module_policy_is_a_schema_error():
    with pytest.raises(SchemaError, match="module 'a'.*recompute"):
        parse_schema('<schema name="s"><module name="a" recompute="often">x</module></schema>')


DOCS3 = ('<schema name="q">Intro. <module name="fruit">apples and pears grow in the orchard</module>'
         '<module name="boats">boats sail on the river to the sea</module>'
         '<module name="birds">the birds fly over the orchard and the river</module></schema>')


def _recomputed_modules(plan, layout):
    """Returns the modules none of whose cells are shared (all computed again)."""
    decoded = {p for op in plan.ops if isinstance(op, DecodeTokens) for p in range(op.start, op.end)}
    return {name for name in ("fruit", "boats", "birds")
            if set(range(layout.modules[name].start, layout.modules[name].end)) <= decoded}


def test_relevant_recomputes_the_whole_module_most_like_the_question(tok):
    layout = layout_of(DOCS3, tok)
    prompt = '<prompt schema="q"><fruit/><boats/><birds/> where do the boats sail ?</prompt>'
    plan = plan_of(layout, prompt, tok, recompute=parse_policy("relevant:1"))
    assert _recomputed_modules(plan, layout) == {"boats"}
    assert not any(isinstance(op, CopyCells) and op.module == "boats" for op in plan.ops)
    two = plan_of(layout, prompt, tok, recompute=parse_policy("relevant:2"))
    # "the" is in every module and counts for little; "river" was not asked about: "sail" and "boats" win,
    # then the tie between fruit and birds ("the" only) goes to the earlier module.
    assert _recomputed_modules(two, layout) == {"boats", "fruit"}
    assert plan.tokens == plan_of(layout, prompt, tok).tokens


def test_relevant_does_nothing_without_prompt_text(tok):
    layout = layout_of(DOCS3, tok)
    plan = plan_of(layout, '<prompt schema="q"><fruit/><boats/></prompt>', tok, recompute=parse_policy("relevant:1"))
    assert plan.cached_tokens == plan_of(layout, '<prompt schema="q"><fruit/><boats/></prompt>', tok).cached_tokens


def test_the_baseline_computes_a_module_whole_then_its_recomputed_tail_again(tok):
    layout = layout_of(SCHEMA, tok)
    plan = plan_of(layout, PROMPT, tok, recompute=parse_policy("tail:2"))
    a, b = layout.modules["a"], layout.modules["b"]
    index = {p: i for i, p in enumerate(plan.positions)}
    # Each module's encoding computed it in one call; the prompt then computes its last 2 tokens again.
    assert (index[a.start], index[a.end - 1] + 1) in plan.calls
    assert (index[a.end - 2], index[a.end - 1] + 1) in plan.calls
    assert (index[b.start], index[b.end - 1] + 1) in plan.calls
    assert (index[b.end - 2], index[b.end - 1] + 1) in plan.calls
    assert plan.calls[-1][1] == len(plan.tokens)
