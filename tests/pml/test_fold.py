"""A schema longer than the context is folded: every top-level module right after the preamble."""

from __future__ import annotations

import pytest

from pc_cpu.errors import SchemaError
from pc_cpu.pml.fold import fold_layout
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.plan import CopyCells, build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.roles import PLAIN_MARKUP
from tests.fake_tokenizer import WordTokenizer
from tests.pml.conftest import layout_of

LIBRARY = ('<schema name="lib">Notes follow. <module name="a">a1 a2 a3</module> and <module name="b">b1 b2'
           '</module><union><module name="c">c1</module><module name="d">d1 d2 d3 d4</module></union> End.</schema>')


def test_a_schema_that_fits_is_not_folded():
    layout = layout_of(LIBRARY)
    assert fold_layout(layout, layout.length) is layout


def test_folded_modules_start_after_the_preamble_and_root_text_follows_the_longest():
    layout = layout_of(LIBRARY)
    folded = fold_layout(layout, 8)
    p = layout.preamble_end
    assert folded.folded and folded.preamble_end == p
    assert {name: folded.modules[name].start for name in "abcd"} == dict.fromkeys("abcd", p)
    assert [folded.modules[n].end - p for n in "abcd"] == [3, 2, 1, 4]  # lengths kept
    root_after = [piece for piece in folded.modules[ROOT].pieces if piece.start >= p]
    assert root_after[0].start == p + 4  # after d, the longest
    assert folded.length == root_after[-1].end
    assert folded.unions[next(iter(folded.unions))].start == p
    # The same tokens, only other positions.
    assert {n: [pc.tokens for pc in folded.modules[n].pieces] for n in "abcd"} == \
        {n: [pc.tokens for pc in layout.modules[n].pieces] for n in "abcd"}


def test_prompts_of_a_folded_schema_are_packed_and_the_first_module_is_not_moved():
    tok = WordTokenizer()
    folded = fold_layout(layout_of(LIBRARY, tokenizer=tok), 8)
    plan = build_plan(folded, parse_prompt('<prompt schema="lib"><a/><b/>Q</prompt>'), tok, PLAIN_MARKUP)
    a, b = [op for op in plan.ops if isinstance(op, CopyCells) and op.module != ROOT]
    assert (a.start, a.moved) == (folded.preamble_end, False)
    assert (b.start, b.home, b.moved) == (a.end, folded.preamble_end, True)
    assert list(plan.positions) == list(range(len(plan.tokens)))


def test_a_scaffold_across_top_level_modules_cannot_be_folded():
    layout = layout_of('<schema name="s">P <scaffold name="x"><module name="a">a1</module><module name="b">b1'
                       '</module></scaffold></schema>')
    with pytest.raises(SchemaError, match="scaffold 'x' spans several"):
        fold_layout(layout, 2)
