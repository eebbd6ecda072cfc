"""Tests of a schema's segments (pc_cpu.pml.encoding): what each encoding's cells attend to when they are computed."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError, SchemaError
from pc_cpu.pml.encoding import (ENCODING_MODES, check_mode, check_scaffolds, encode_cells, encoded_after,
                                 encoding_content, home_segments, home_shift, module_segments, scaffold_cells,
                                 scaffold_segment, scaffold_segments, segments_of)
from pc_cpu.pml.layout import ROOT
from tests.pml.conftest import CHATML_MARKUP, layout_of, words

# Positions with CHATML_MARKUP and BOS:
#   ROOT preamble [0, 5): <bos> <|im_start|> system Sys <|im_end|>
#   a [5, 8): "A1" 5, b "B" 6, "A2" 7 | ROOT "Mid" 8 | c "C" 9
SCHEMA = ('<schema name="s"><system>Sys</system><module name="a">A1 <module name="b">B</module> A2</module>'
          'Mid<module name="c">C</module></schema>')
PREAMBLE = ["<bos>", "<|im_start|>", "system", "Sys", "<|im_end|>"]


@pytest.fixture
def layout(tok):
    return layout_of(SCHEMA, CHATML_MARKUP, tokenizer=tok)


def jobs(tok, layout, module, mode):
    """Returns each of a module's segments as (start, words, context words, first_position, shared_context)."""
    return [(s.start, words(tok, s.tokens), words(tok, s.context), s.first_position, s.shared_context)
            for s in module_segments(layout, module, mode)]


# --- preamble mode ------------------------------------------------------------------------------

def test_module_right_after_the_preamble_sees_exactly_the_preamble(tok, layout):
    (first, _) = jobs(tok, layout, "a", "preamble")

    assert first == (5, ["A1"], PREAMBLE, 0, ((ROOT, 0, 5),))


def test_second_run_of_a_module_includes_its_first_run(tok, layout):
    (_, second) = jobs(tok, layout, "a", "preamble")

    # the context skips the child b (position 6), so it is decoded one position early, not shared
    assert second == (7, ["A2"], PREAMBLE + ["A1"], 1, ())


def test_nested_module_context_includes_the_parents_earlier_text(tok, layout):
    assert jobs(tok, layout, "b", "preamble") == [(6, ["B"], PREAMBLE + ["A1"], 0, ((ROOT, 0, 5), ("a", 5, 6)))]


def test_module_after_root_text_that_follows_a_module(tok, layout):
    # "Mid" is computed per prompt, not cached, so the context is decoded rather than shared
    assert jobs(tok, layout, "c", "preamble") == [(9, ["C"], PREAMBLE + ["Mid"], 3, ())]


def test_root_encodes_only_its_preamble(tok, layout):
    assert jobs(tok, layout, ROOT, "preamble") == [(0, PREAMBLE, [], 0, ())]


def test_root_text_after_a_module_gets_no_encode_job(tok):
    # ROOT caches only its preamble (one run), so ROOT never has a second run with earlier runs as context
    layout = layout_of('<schema name="s">Intro <module name="m">x</module> outro</schema>', tokenizer=tok)

    assert jobs(tok, layout, ROOT, "preamble") == [(0, ["<bos>", "Intro"], [], 0, ())]
    assert jobs(tok, layout, "m", "preamble") == [(2, ["x"], ["<bos>", "Intro"], 0, ((ROOT, 0, 2),))]


def test_param_placeholders_are_encoded_and_seen_by_later_runs(tok):
    layout = layout_of('<schema name="s"><module name="m">Go <param name="p" len="2"/> now <module name="n">N'
                       '</module> end</module></schema>', tokenizer=tok)

    assert jobs(tok, layout, "m", "preamble") == [
        (1, ["Go", "<ph>", "<ph>", "now"], ["<bos>"], 0, ((ROOT, 0, 1),)),
        (6, ["end"], ["<bos>", "Go", "<ph>", "<ph>", "now"], 1, ()),
    ]
    assert jobs(tok, layout, "n", "preamble") == [
        (5, ["N"], ["<bos>", "Go", "<ph>", "<ph>", "now"], 0, ((ROOT, 0, 1), ("m", 1, 5)))]


def test_union_members_each_see_the_same_context(tok):
    layout = layout_of('<schema name="s">Pick: <union><module name="x">X</module><module name="y">Y Y</module>'
                       '</union></schema>', tokenizer=tok)

    assert jobs(tok, layout, "x", "preamble") == [(3, ["X"], ["<bos>", "Pick", ":"], 0, ((ROOT, 0, 3),))]
    assert jobs(tok, layout, "y", "preamble") == [(3, ["Y", "Y"], ["<bos>", "Pick", ":"], 0, ((ROOT, 0, 3),))]


# --- independent mode ---------------------------------------------------------------------------

def test_independent_module_has_no_context(tok, layout):
    assert jobs(tok, layout, "b", "independent") == [(6, ["B"], [], 6, ())]
    assert jobs(tok, layout, "c", "independent") == [(9, ["C"], [], 9, ())]


def test_independent_second_run_sees_only_its_own_first_run(tok, layout):
    assert jobs(tok, layout, "a", "independent") == [(5, ["A1"], [], 5, ()), (7, ["A2"], ["A1"], 6, ())]


def test_independent_root(tok, layout):
    assert jobs(tok, layout, ROOT, "independent") == [(0, PREAMBLE, [], 0, ())]


# --- sizes and modes ----------------------------------------------------------------------------

def test_encode_cells_counts_each_run_once_and_the_largest_context(layout):
    # A run's cells are computed once and shared into the library: counting them again (as the
    # scratch and as library cells) refused a 4,600-token module in an 8,192-cell context.
    assert encode_cells(layout, "a", "preamble") == 8  # runs A1 and A2, and A2's six context tokens
    assert encode_cells(layout, "b", "preamble") == 7  # B after the preamble and A1
    assert encode_cells(layout, ROOT, "preamble") == 5  # the ROOT preamble itself
    assert encode_cells(layout, "a", "independent") == 3  # A2 after A1 only


@pytest.mark.parametrize("mode", ["Preamble", "joint", ""])
def test_invalid_mode_names_the_valid_ones(mode, layout):
    with pytest.raises(PromptCacheError) as info:
        module_segments(layout, "a", mode)

    assert str(info.value) == f"encoding mode {mode!r} is unknown; use one of: preamble, independent, chain"


def test_check_mode_returns_valid_modes():
    assert [check_mode(m) for m in ENCODING_MODES] == ["preamble", "independent", "chain"]


# --- scaffolds ----------------------------------------------------------------------------------

# <bos> "Docs :" 0-3 | scaffold x: a "A a" 3-5, ROOT "mid" 5, b "B" 6 + param p 7-9 | d "D" 9
SCAFFOLD = ('<schema name="s">Docs: <scaffold name="x"><module name="a">A a</module> mid <module name="b">B '
            '<param name="p" len="2"/></module></scaffold><module name="d">D</module></schema>')


def test_scaffold_job_computes_member_runs_back_to_back_after_the_first_members_context(tok):
    layout = layout_of(SCAFFOLD, tokenizer=tok)

    (job,) = scaffold_segments(layout, "preamble")

    assert job.name == "scaffold:x" and segments_of(layout, "scaffold:x", "preamble") == [job]
    assert [(r.start, words(tok, r.tokens)) for r in job.runs] == [(3, ["A", "a"]), (6, ["B", "<ph>", "<ph>"])]
    assert job.computed_starts() == (3, 5)  # b is computed right after a, then moved to 6
    assert words(tok, job.tokens) == ["A", "a", "B", "<ph>", "<ph>"]
    assert job.n_tokens == 5
    assert words(tok, job.context) == ["<bos>", "Docs", ":"]
    assert job.first_position == 0
    assert job.shared_context == ((ROOT, 0, 3),)


def test_independent_scaffold_job_has_no_context(tok):
    (job,) = scaffold_segments(layout_of(SCAFFOLD, tokenizer=tok), "independent")

    assert (job.context, job.first_position, job.shared_context) == ((), 3, ())


def test_adjacent_member_runs_are_merged():
    layout = layout_of('<schema name="s"><scaffold name="x"><module name="a">A</module><module name="b">B'
                       '</module></scaffold></schema>')

    (job,) = scaffold_segments(layout, "preamble")
    assert [(r.start, r.end) for r in job.runs] == [(1, 3)]


def test_scaffold_cells_and_encode_cells_count_the_joint_encodings():
    layout = layout_of(SCAFFOLD)

    assert layout.cached_cells == 9  # ROOT preamble 3, a 2, b 3, d 1
    assert scaffold_cells(layout) == 5  # a 2 and b 3 once more, jointly
    (job,) = scaffold_segments(layout, "preamble")
    assert encode_cells(layout, job.name, "preamble") == 8  # 3 context + 5 tokens


def test_scaffold_holding_a_union_member_is_refused():
    layout = layout_of('<schema name="s"><scaffold name="x"><module name="a">A</module><union name="u">'
                       '<module name="b">B</module><module name="c">C</module></union></scaffold></schema>')

    with pytest.raises(SchemaError) as info:
        check_scaffolds(layout)
    assert "scaffold 'x' holds module 'b' of union 'u'" in str(info.value)
    assert "move the union out of the scaffold" in str(info.value)


def test_scaffolds_without_unions_pass_the_check():
    check_scaffolds(layout_of(SCAFFOLD))


# --- chain mode ---------------------------------------------------------------------------------

# Positions with CHATML_MARKUP and BOS:
#   ROOT preamble [0, 5) | a "A" 5 | b "B B" [6, 8) | union u: x "X" 8, y "Y Y" [8, 10) | c "C" 10
#   | e "E1" 11, e.n "N" 12, "E2" 13 | f "F" 14 | ROOT "Mid" 15 | d "D" 16
CHAIN = ('<schema name="s"><system>Sys</system><module name="a">A</module><module name="b">B B</module>'
         '<union name="u"><module name="x">X</module><module name="y">Y Y</module></union>'
         '<module name="c">C</module><module name="e">E1 <module name="n">N</module> E2</module>'
         '<module name="f">F</module>Mid<module name="d">D</module></schema>')


@pytest.fixture
def chain(tok):
    return layout_of(CHAIN, CHATML_MARKUP, tokenizer=tok)


def test_chain_module_is_computed_after_the_preamble_and_its_neighbours_cells(tok, chain):
    assert jobs(tok, chain, "b", "chain") == [(6, ["B", "B"], PREAMBLE + ["A"], 0, ((ROOT, 0, 5), ("a", 5, 6)))]
    assert module_segments(chain, "b", "chain")[0].after == "a"


def test_chain_first_module_is_computed_as_in_preamble_mode(chain):
    assert module_segments(chain, "a", "chain") == module_segments(chain, "a", "preamble")


def test_chain_union_members_follow_the_module_before_the_union(chain):
    assert [j.after for j in module_segments(chain, "x", "chain")] == ["b"]
    assert [j.after for j in module_segments(chain, "y", "chain")] == ["b"]


def test_chain_module_after_a_union_or_root_text_has_no_neighbour(chain):
    # which member a prompt imports is not known when c is encoded; "Mid" is computed per prompt
    for module in ("c", "d"):
        assert module_segments(chain, module, "chain") == module_segments(chain, module, "preamble")


def test_chain_neighbour_shares_only_its_own_runs_and_nested_modules_keep_preamble_mode(tok, chain):
    (job,) = module_segments(chain, "f", "chain")
    assert (job.after, job.shared_context) == ("e", ((ROOT, 0, 5), ("e", 11, 12), ("e", 13, 14)))
    assert words(tok, job.context) == PREAMBLE + ["E1", "E2"]
    assert module_segments(chain, "n", "chain") == module_segments(chain, "n", "preamble")
    assert [j.after for j in module_segments(chain, "e", "chain")] == ["c", None]


def test_encoded_after_names_the_neighbour_of_modules_and_scaffolds(tok):
    layout = layout_of('<schema name="s"><module name="a">A</module><scaffold name="k"><module name="b">B'
                       '</module><module name="c">C</module></scaffold></schema>', tokenizer=tok)

    assert [encoded_after(layout, key, "chain") for key in (ROOT, "a", "b", "c", "scaffold:k")] == [
        None, None, "a", "b", "a"]
    assert encoded_after(layout, "b", "preamble") is None


# --- homes: where an encoding is computed before it is moved into place --------------------------

def test_a_module_after_other_text_has_its_home_where_its_context_starts_at_zero(tok, layout):
    assert [home_shift(layout, m, "preamble") for m in (ROOT, "a", "b", "c")] == [0, 0, 0, 3]
    (job,) = home_segments(layout, "c", "preamble")
    assert (job.start, words(tok, job.tokens), job.first_position, job.shared_context) == (6, ["C"], 0, ())
    assert words(tok, job.context) == PREAMBLE + ["Mid"]


def test_every_run_of_a_module_moves_home_by_the_same_shift(tok, layout):
    assert home_shift(layout, "a", "independent") == 5
    assert [(j.start, j.first_position) for j in home_segments(layout, "a", "independent")] == [(0, 0), (2, 1)]


def test_chain_links_are_computed_in_place(tok):
    chain = layout_of('<schema name="s">Hi <module name="a">A</module><module name="b">B</module></schema>',
                      tokenizer=tok)
    assert home_shift(chain, "b", "chain") == 0 and home_shift(chain, "b", "preamble") == 1  # after <bos> Hi, A


def scaffold_after(first: str) -> str:
    return (f'<schema name="s">Notes: <module name="n0">{first}</module><scaffold name="k"><module name="b">B'
            '</module> and <module name="c">C</module></scaffold></schema>')


def test_a_scaffold_after_a_module_has_its_home_where_its_context_starts_at_zero(tok):
    layout = layout_of(scaffold_after("Cups"), tokenizer=tok)
    job = scaffold_segment(layout, "k", "preamble")
    shift = home_shift(layout, "scaffold:k", "preamble")
    assert shift == job.first_position > 0 and home_shift(layout, "scaffold:k", "chain") == 0  # chain: a link
    (home,) = home_segments(layout, "scaffold:k", "preamble")
    assert home.first_position == 0 and home.shared_context == () and home.context == job.context
    assert [(r.start + shift, r.tokens) for r in home.runs] == [(r.start, r.tokens) for r in job.runs]
    assert home_shift(layout_of(SCAFFOLD, tokenizer=tok), "scaffold:x", "preamble") == 0  # right after the preamble


def test_lengthening_a_module_keeps_the_home_key_of_a_scaffold_after_it(tok):
    short, long = (layout_of(scaffold_after(text), tokenizer=tok) for text in ("Cups", "Cups and jars"))
    assert encoding_content(short, "scaffold:k", "preamble", at_home=True) == encoding_content(
        long, "scaffold:k", "preamble", at_home=True)
    assert encoding_content(short, "scaffold:k", "preamble") != encoding_content(long, "scaffold:k", "preamble")


def notes_schema(first: str) -> str:
    return f'<schema name="s">Notes: <module name="n0">{first}</module><module name="n1">Tea</module></schema>'


@pytest.mark.parametrize("mode", ["preamble", "independent"])
def test_lengthening_a_module_keeps_the_home_key_of_the_module_after_it(tok, mode):
    short, long = layout_of(notes_schema("Cups"), tokenizer=tok), layout_of(notes_schema("Cups and jars"), tokenizer=tok)
    assert long.modules["n1"].start > short.modules["n1"].start

    assert encoding_content(short, "n1", mode, at_home=True) == encoding_content(long, "n1", mode, at_home=True)
    assert encoding_content(short, "n1", mode) != encoding_content(long, "n1", mode)  # in place: positions differ
    assert encoding_content(short, "n0", mode, at_home=True) != encoding_content(long, "n0", mode, at_home=True)


def test_an_encoding_computed_in_place_has_one_key_either_way(tok, layout):
    for module in (ROOT, "a", "b"):
        assert encoding_content(layout, module, "preamble", at_home=True) == encoding_content(layout, module, "preamble")
