"""Tests of schema layout (pc_cpu.pml.layout): every node's tokens and its [start, end) positions."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptError, SchemaError
from pc_cpu.pml.layout import ROOT, NodeLayout, Piece, Run, ScaffoldLayout, UnionLayout
from pc_cpu.pml.roles import PLAIN_MARKUP
from tests.fake_tokenizer import WordTokenizer
from tests.pml.conftest import CHATML_MARKUP, TRIP, layout_of, words


def own(layout, tok, name):
    """Returns [(start, words, param)] of a module's own pieces."""
    return [(p.start, words(tok, p.tokens), p.param) for p in layout.modules[name].pieces]


# --- positions ----------------------------------------------------------------------------------

def test_trip_module_ranges(tok):
    layout = layout_of(TRIP, tokenizer=tok)

    assert layout.schema == "trip"
    assert layout.length == 14
    assert list(layout.modules) == [ROOT, "plan", "paris", "tokyo"]
    ranges = {name: (m.start, m.end, m.parent, m.union, m.children) for name, m in layout.modules.items()}
    assert ranges == {
        ROOT: (0, 14, None, None, ("plan",)),
        "plan": (3, 13, ROOT, None, ("paris", "tokyo")),
        "paris": (10, 13, "plan", "city", ()),
        "tokyo": (10, 11, "plan", "city", ()),
    }


def test_trip_own_pieces(tok):
    layout = layout_of(TRIP, tokenizer=tok)

    assert own(layout, tok, ROOT) == [(0, ["<bos>"], None), (1, ["Trips", ":"], None), (13, ["Bye"], None)]
    assert own(layout, tok, "plan") == [(3, ["Plan"], None), (4, ["<ph>"] * 4, "days"), (8, ["days", "in"], None)]
    assert own(layout, tok, "paris") == [(10, ["Paris", "is", "nice"], None)]
    assert own(layout, tok, "tokyo") == [(10, ["Tokyo"], None)]


def test_union_members_share_a_start_and_the_union_reserves_the_longest():
    layout = layout_of('<schema name="s"><union name="u"><module name="short">a</module>'
                       '<module name="long">a b c d</module><module name="mid">a b</module></union>'
                       'after</schema>')

    assert layout.unions["u"] == UnionLayout("u", 1, 4, ("short", "long", "mid"), ROOT)
    assert [layout.modules[m].start for m in ("short", "long", "mid")] == [1, 1, 1]
    assert [layout.modules[m].end for m in ("short", "long", "mid")] == [2, 5, 3]
    assert layout.modules[ROOT].pieces[-1].start == 5  # text after the union follows its longest member
    assert layout.length == 6


def test_a_param_reserves_len_placeholder_positions():
    layout = layout_of('<schema name="s"><module name="m">Go <param name="when" len="3"/> now</module></schema>')
    module = layout.modules["m"]

    assert module.params() == {"when": Piece(2, (0, 0, 0), "when")}
    assert module.pieces[-1].start == 5
    assert (module.start, module.end) == (1, 6)
    assert module.n_tokens == 5  # placeholders are encoded too


def test_nested_module_lies_inside_its_parent():
    layout = layout_of('<schema name="s"><module name="a">x <module name="b">y <module name="c">z</module>'
                       ' w</module> v</module></schema>')
    a, b, c = (layout.modules[n] for n in "abc")

    assert (a.start, a.end) == (1, 6)
    assert (b.start, b.end) == (2, 5)
    assert (c.start, c.end) == (3, 4)
    assert (a.children, b.children, c.children) == (("b",), ("c",), ())
    assert [p.start for p in a.pieces] == [1, 5]


def test_root_gets_bos_at_zero_when_the_tokenizer_has_one():
    tok = WordTokenizer(bos=True)
    layout = layout_of('<schema name="s">Hi <module name="m">there</module></schema>', tokenizer=tok)

    assert own(layout, tok, ROOT) == [(0, ["<bos>"], None), (1, ["Hi"], None)]
    assert layout.modules["m"].start == 2
    assert layout.length == 3


def test_root_has_no_bos_when_bos_id_is_none():
    tok = WordTokenizer(bos=False)
    layout = layout_of('<schema name="s">Hi <module name="m">there</module></schema>', tokenizer=tok)

    assert own(layout, tok, ROOT) == [(0, ["Hi"], None)]
    assert layout.modules["m"].start == 1
    assert layout.length == 2


def test_schema_of_only_a_module_without_bos_starts_at_zero():
    layout = layout_of('<schema name="s"><module name="m">x</module></schema>', tokenizer=WordTokenizer(bos=False))

    assert layout.modules[ROOT].pieces == ()
    assert (layout.modules["m"].start, layout.length) == (0, 1)


def test_scaffold_lays_out_its_modules_in_place():
    layout = layout_of('<schema name="s"><scaffold name="both">Docs: <module name="a">A <module name="a2">A2'
                       '</module></module><module name="b">B</module></scaffold> end</schema>')

    assert layout.scaffolds["both"] == ScaffoldLayout("both", 1, 6, ("a", "a2", "b"))
    assert layout.modules["a"].parent == ROOT  # a scaffold is not a module
    assert (layout.modules["b"].start, layout.modules["b"].end) == (5, 6)


def test_module_without_tokens_is_a_schema_error():
    with pytest.raises(SchemaError, match="module 'm' has no tokens; give it text") as info:
        layout_of('<schema name="s">\n<module name="m"> </module></schema>')

    assert info.value.line == 2


def test_module_of_only_a_child_module_has_no_own_pieces():
    layout = layout_of('<schema name="s"><module name="a"><module name="b">x</module></module></schema>')

    assert layout.modules["a"].pieces == ()
    assert layout.modules["a"].runs() == ()
    assert (layout.modules["a"].start, layout.modules["a"].end) == (1, 2)


# --- runs ---------------------------------------------------------------------------------------

def test_runs_merge_consecutive_pieces_including_param_slots(tok):
    layout = layout_of(TRIP, tokenizer=tok)

    (run,) = layout.modules["plan"].runs()
    assert (run.start, run.end) == (3, 10)
    assert words(tok, run.tokens) == ["Plan", "<ph>", "<ph>", "<ph>", "<ph>", "days", "in"]


def test_runs_split_around_child_modules(tok):
    layout = layout_of('<schema name="s">Intro <module name="a">x <module name="b">y</module> z</module>'
                       ' Outro</schema>', tokenizer=tok)

    assert [(r.start, words(tok, r.tokens)) for r in layout.modules["a"].runs()] == [(2, ["x"]), (4, ["z"])]
    assert [(r.start, words(tok, r.tokens)) for r in layout.modules[ROOT].runs()] == [
        (0, ["<bos>", "Intro"]), (5, ["Outro"])]
    assert Run(4, (5, 6)).end == 6


# --- role markup --------------------------------------------------------------------------------

def test_role_markup_tokens_are_inserted_around_role_text(tok):
    layout = layout_of('<schema name="s"><system>Be brief.</system><user><module name="doc">Doc text</module>'
                       ' Question?</user></schema>', CHATML_MARKUP, tokenizer=tok)

    assert layout.uses_roles
    assert own(layout, tok, ROOT) == [
        (0, ["<bos>"], None),
        (1, ["<|im_start|>", "system"], None),
        (3, ["Be", "brief", "."], None),
        (6, ["<|im_end|>"], None),
        (7, ["<|im_start|>", "user"], None),
        (11, ["Question", "?"], None),
        (13, ["<|im_end|>"], None),
    ]
    assert own(layout, tok, "doc") == [(9, ["Doc", "text"], None)]
    assert layout.length == 14


def test_role_markup_inside_a_module_belongs_to_the_module(tok):
    layout = layout_of('<schema name="s"><module name="m"><user>Hi</user></module></schema>',
                       PLAIN_MARKUP, tokenizer=tok)

    assert own(layout, tok, "m") == [(1, ["User", ":"], None), (3, ["Hi"], None)]  # PLAIN suffix "\n": no token


def test_schema_without_roles_does_not_use_them():
    assert not layout_of(TRIP).uses_roles


# --- NodeLayout rows ----------------------------------------------------------------------------

def test_node_rows_of_the_trip_schema():
    layout = layout_of(TRIP)

    assert sorted(layout.nodes, key=lambda n: (n.start, n.kind, n.name)) == sorted([
        NodeLayout("#text", "text", 0, 1, None, 1),
        NodeLayout("#text", "text", 1, 2, None, 2),
        NodeLayout("plan", "module", 3, 10, None, 7),
        NodeLayout("#text", "text", 3, 1, "plan", 1),
        NodeLayout("days", "param", 4, 4, "plan", 4),
        NodeLayout("#text", "text", 8, 2, "plan", 2),
        NodeLayout("city", "union", 10, 3, "plan", 0),
        NodeLayout("paris", "module", 10, 3, "plan", 3),
        NodeLayout("#text", "text", 10, 3, "paris", 3),
        NodeLayout("tokyo", "module", 10, 1, "plan", 1),
        NodeLayout("#text", "text", 10, 1, "tokyo", 1),
        NodeLayout("#text", "text", 13, 1, None, 1),
    ], key=lambda n: (n.start, n.kind, n.name))
    assert [n.start for n in layout.nodes] == sorted(n.start for n in layout.nodes)


def test_node_rows_list_each_parent_before_its_children():
    layout = layout_of(TRIP)

    assert [(n.name, n.kind) for n in layout.nodes] == [
        ("#text", "text"), ("#text", "text"),
        ("plan", "module"), ("#text", "text"), ("days", "param"), ("#text", "text"),
        ("city", "union"), ("paris", "module"), ("#text", "text"), ("tokyo", "module"), ("#text", "text"),
        ("#text", "text"),
    ]


def test_scaffold_row():
    layout = layout_of('<schema name="s"><scaffold name="sc"><module name="a">A</module></scaffold></schema>')

    assert NodeLayout("sc", "scaffold", 1, 1, None, 0) in layout.nodes


# --- lookups ------------------------------------------------------------------------------------

def test_ancestors_outermost_first():
    layout = layout_of(TRIP)

    assert layout.ancestors("paris") == [ROOT, "plan"]
    assert layout.ancestors("plan") == [ROOT]
    assert layout.ancestors(ROOT) == []


def test_module_lookup_names_the_known_modules():
    layout = layout_of(TRIP)

    assert layout.module("paris").name == "paris"
    with pytest.raises(PromptError) as info:
        layout.module("rome")
    assert str(info.value) == "schema 'trip' has no module 'rome'; its modules: plan, paris, tokyo"


def test_module_lookup_in_a_schema_without_modules():
    with pytest.raises(PromptError, match="its modules: none"):
        layout_of('<schema name="s">text</schema>').module("x")


def test_preamble_is_root_text_before_the_first_module():
    layout = layout_of(TRIP)

    assert layout.preamble_end == 3
    assert layout.cached_runs(ROOT) == (Run(0, layout.modules[ROOT].pieces[0].tokens
                                            + layout.modules[ROOT].pieces[1].tokens),)
    assert not layout.is_cached(ROOT, layout.modules[ROOT].pieces[-1])  # "Bye" after a module
    assert not layout.is_cached("plan", layout.modules["plan"].params()["days"])
    assert layout.is_cached("plan", layout.modules["plan"].pieces[0])


def test_preamble_of_a_schema_without_modules_is_all_of_it():
    layout = layout_of('<schema name="s">just text</schema>')

    assert layout.preamble_end == layout.length == 3


def test_cached_cells_count_every_encoded_cell():
    # ROOT preamble 3 ("<bos> Trips :"), plan 7 (with 4 placeholders), paris 3, tokyo 1; "Bye" is per prompt
    assert layout_of(TRIP).cached_cells == 14


def test_layout_is_read_only():
    layout = layout_of(TRIP)

    with pytest.raises(TypeError):
        layout.modules["x"] = layout.modules["plan"]  # type: ignore[index]
