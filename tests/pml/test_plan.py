"""Tests of plan building (pc_cpu.pml.plan): which cells to share and which tokens to compute, in order."""

from __future__ import annotations

import pytest

from pc_cpu.errors import ArgumentTooLongError, PromptError
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan, build_plan
from pc_cpu.pml.prompt import parse_prompt
from tests.fake_tokenizer import WordTokenizer
from pc_cpu.pml.roles import PLAIN_MARKUP
from tests.pml.conftest import CHATML_MARKUP, TRIP, layout_of, plan_of, words

CHAT = '<schema name="c"><system>Be brief.</system><module name="doc">Doc text</module></schema>'


def prompt_part(tok: WordTokenizer, plan: Plan) -> tuple:
    """Returns ("decode", start, words) of the prompt's own text: its first turn's role markup (a decode of
    its own, so that kept prompt streams reuse it) joined with the rest."""
    ops = plan.ops[-2:] if len(plan.ops) > 1 and getattr(plan.ops[-2], "what", "") == "prompt markup" else plan.ops[-1:]
    return ("decode", ops[0].start, [w for op in ops for w in words(tok, op.tokens)])


def steps(tok: WordTokenizer, plan: Plan) -> list[tuple]:
    """Returns each op as ("copy", module, start, words), ("copy", module, start, words, source) when the
    cells come from a scaffold's joint encoding, or ("decode", start, words)."""
    out = []
    for op in plan.ops:
        if isinstance(op, DecodeTokens):
            out.append(("decode", op.start, words(tok, op.tokens)))
        elif op.source is None:
            out.append(("copy", op.module, op.start, words(tok, op.tokens)))
        else:
            out.append(("copy", op.module, op.start, words(tok, op.tokens), op.source))
    return out


def trip_plan(prompt_body: str, tok: WordTokenizer | None = None) -> Plan:
    return plan_of(TRIP, f'<prompt schema="trip">{prompt_body}</prompt>', tokenizer=tok)


def plan_error(schema: str, prompt: str, error=PromptError) -> PromptError:
    with pytest.raises(error) as info:
        plan_of(schema, prompt)
    return info.value


def trip_error(prompt_body: str, error=PromptError) -> PromptError:
    return plan_error(TRIP, f'<prompt schema="trip">{prompt_body}</prompt>', error)


# --- ops ----------------------------------------------------------------------------------------

def test_trip_plan_ops_in_position_order(tok):
    plan = trip_plan('<plan days="3"><paris/></plan>Where?', tok)

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>", "Trips", ":"]),
        ("copy", "plan", 3, ["Plan"]),
        ("decode", 4, ["3"]),  # the argument at its slot; positions 5-7 stay empty
        ("copy", "plan", 8, ["days", "in"]),
        ("copy", "paris", 10, ["Paris", "is", "nice"]),
        ("decode", 13, ["Bye"]),  # ROOT text after a module
        ("decode", 14, ["Where", "?"]),  # then the free text, a decode of its own (stream reuse)
    ]
    assert plan.schema == "trip"
    assert plan.modules == (ROOT, "plan", "paris")
    assert plan.ops[2].what == "argument 'days' of module 'plan'"


def test_plan_totals(tok):
    plan = trip_plan('<plan days="3"><paris/></plan>Where?', tok)

    assert words(tok, plan.tokens) == ["<bos>", "Trips", ":", "Plan", "3", "days", "in", "Paris", "is", "nice",
                                       "Bye", "Where", "?"]
    assert plan.positions == (0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15)
    assert plan.cached_tokens == 9
    assert plan.uncached_tokens == 4
    assert plan.end == 16


def test_ops_have_strictly_increasing_non_overlapping_positions():
    plan = trip_plan('<plan days="a b"><tokyo/></plan>Go')

    for before, after in zip(plan.ops, plan.ops[1:]):
        assert before.end <= after.start
    assert list(plan.positions) == sorted(set(plan.positions))


def test_copies_within_a_module_are_merged():
    plan = plan_of('<schema name="s"><module name="m">a <union name="u"><module name="x">x</module></union>'
                   ' b</module>Tail</schema>', '<prompt schema="s"><m/>Q</prompt>')

    copies = [op for op in plan.ops if isinstance(op, CopyCells)]
    assert [(op.module, op.start, op.end) for op in copies] == [(ROOT, 0, 1), ("m", 1, 2), ("m", 3, 4)]
    plan = plan_of('<schema name="s"><module name="m">a <param name="p" len="2"/> b</module></schema>',
                   '<prompt schema="s"><m p=""/>Q</prompt>')
    assert [(op.start, op.end) for op in plan.ops if isinstance(op, CopyCells)] == [(0, 1), (1, 2), (4, 5)]


def test_consecutive_pieces_of_one_module_are_one_copy():
    plan = plan_of('<schema name="s"><module name="m"><user>a</user> b</module></schema>',
                   '<prompt schema="s"><m/>Q</prompt>')

    assert [(type(op).__name__, op.start, op.end) for op in plan.ops] == [
        ("CopyCells", 0, 1), ("CopyCells", 1, 5), ("DecodeTokens", 5, 7), ("DecodeTokens", 7, 10)]  # markup, text


# --- arguments ----------------------------------------------------------------------------------

def test_argument_of_exactly_len_tokens(tok):
    plan = trip_plan('<plan days="a b c d"><tokyo/></plan>', tok)

    assert steps(tok, plan)[2] == ("decode", 4, ["a", "b", "c", "d"])
    assert steps(tok, plan)[3] == ("copy", "plan", 8, ["days", "in"])


def test_empty_argument_decodes_nothing(tok):
    plan = trip_plan('<plan days=""/>', tok)

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>", "Trips", ":"]),
        ("copy", "plan", 3, ["Plan"]),
        ("copy", "plan", 8, ["days", "in"]),
        ("decode", 10, ["Bye"]),  # right after the last shared cell: the union's gap is not kept
    ]


def test_argument_too_long():
    error = trip_error('<plan days="a b c d e"/>', ArgumentTooLongError)

    assert str(error) == ("param 'days' of module 'plan': argument is 5 tokens > len=4; shorten it or raise len in "
                          "schema 'trip'")


def test_missing_argument():
    error = trip_error('\n<plan/>')

    assert str(error) == ("module 'plan' needs an argument for param 'days' (up to 4 tokens): write "
                          "<plan days=\"...\"/> (line 2)")


def test_unknown_argument():
    error = trip_error('<plan days="3" nights="2"/>')

    assert "module 'plan' has no param 'nights'; its params: days" in str(error)


def test_argument_to_a_module_without_params():
    error = trip_error('<plan days="3"><paris size="big"/></plan>')

    assert "module 'paris' has no param 'size'; its params: none" in str(error)


# --- import errors ------------------------------------------------------------------------------

def test_unknown_module_lists_the_known_ones():
    error = trip_error('<rome/>')

    assert str(error) == "schema 'trip' has no module 'rome'; its modules: plan, paris, tokyo"


def test_nested_module_imported_at_the_top_level():
    error = trip_error('\n<paris/>')

    assert str(error) == ("module 'paris' is inside module 'plan'; import it nested, as <plan><paris/></plan> "
                          "(line 2)")


def test_deeply_nested_module_says_the_whole_chain():
    error = plan_error('<schema name="s"><module name="a">A<module name="b">B<module name="c">C</module>'
                       '</module></module></schema>', '<prompt schema="s"><a><c/></a></prompt>')

    assert "module 'c' is inside module 'b'; import it nested, as <a><b><c/></b></a>" in str(error)


def test_top_level_module_imported_inside_another():
    error = plan_error('<schema name="s"><module name="a">A</module><module name="b">B</module></schema>',
                       '<prompt schema="s"><a><b/></a></prompt>')

    assert "module 'b' is a top-level module; import it outside other imports, as <b/>" in str(error)


def test_union_clash_says_import_one():
    error = trip_error('<plan days="3"><paris/>\n<tokyo/></plan>')

    assert str(error) == "module 'tokyo' is in union 'city' with 'paris': import one of them (line 2)"


def test_duplicate_import():
    error = plan_error('<schema name="s"><module name="a">A</module></schema>',
                       '<prompt schema="s"><a/>\n<a/></prompt>')

    assert str(error) == "module 'a' is imported twice; import it once (line 2)"


def test_prompt_for_another_schema():
    with pytest.raises(PromptError) as info:
        build_plan(layout_of(TRIP), parse_prompt('<prompt schema="other">x</prompt>'), WordTokenizer(),
                   CHATML_MARKUP)

    assert str(info.value) == "prompt is for schema 'other', not 'trip'"


# --- free text and chat -------------------------------------------------------------------------

def test_free_text_starts_right_after_the_last_op(tok):
    layout = layout_of('<schema name="s"><union name="u"><module name="short">a</module>'
                       '<module name="long">a b c d</module></union></schema>', tokenizer=tok)
    plan = build_plan(layout, parse_prompt('<prompt schema="s"><short/>Why?</prompt>'), tok, CHATML_MARKUP)

    assert steps(tok, plan)[-1] == ("decode", 2, ["Why", "?"])  # not at 5, where the union ends
    assert plan.end == 4


def test_free_text_after_a_shorter_argument_starts_inside_the_slot(tok):
    plan = plan_of('<schema name="s"><module name="m">Go <param name="p" len="4"/></module></schema>',
                   '<prompt schema="s"><m p="x"/>Now</prompt>', tokenizer=tok)

    assert steps(tok, plan)[-2:] == [("decode", 2, ["x"]), ("decode", 3, ["Now"])]  # the text right after it


def test_plain_schema_text_has_no_markup(tok):
    plan = trip_plan('Just words', tok)

    assert steps(tok, plan) == [("copy", ROOT, 0, ["<bos>", "Trips", ":"]),
                                ("decode", 3, ["Bye"]), ("decode", 4, ["Just", "words"])]  # no gap kept


def test_generation_prompt_is_appended_for_a_chat_schema(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/><user>Q?</user></prompt>', CHATML_MARKUP, tokenizer=tok)

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>", "<|im_start|>", "system", "Be", "brief", ".", "<|im_end|>"]),
        ("copy", "doc", 7, ["Doc", "text"]),
        ("decode", 9, ["<|im_start|>", "user"]),  # the turn's markup, a decode of its own (stream reuse)
        ("decode", 11, ["Q", "?", "<|im_end|>", "<|im_start|>", "assistant"]),
    ]


def test_bare_text_in_a_chat_schema_is_a_user_turn(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/>Q?</prompt>', CHATML_MARKUP, tokenizer=tok)

    assert prompt_part(tok, plan) == ("decode", 9, ["<|im_start|>", "user", "Q", "?", "<|im_end|>",
                                                  "<|im_start|>", "assistant"])


def test_role_tags_in_a_prompt_make_a_plain_schema_chat(tok):
    plan = trip_plan('<user>Hi</user>', tok)

    assert steps(tok, plan)[-3:] == [("decode", 3, ["Bye"]), ("decode", 4, ["User", ":"]),
                                      ("decode", 6, ["Hi", "Assistant", ":"])]


def test_open_assistant_turn_is_continued_without_a_generation_prompt(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/><user>Q?</user><assistant>Sure,</assistant></prompt>',
                   CHATML_MARKUP, tokenizer=tok)

    assert prompt_part(tok, plan) == ("decode", 9, ["<|im_start|>", "user", "Q", "?", "<|im_end|>",
                                                  "<|im_start|>", "assistant", "Sure", ","])


def test_assistant_turn_before_a_user_turn_is_closed(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/><assistant>A</assistant><user>Q</user></prompt>',
                   CHATML_MARKUP, tokenizer=tok)

    assert prompt_part(tok, plan) == ("decode", 9, [
        "<|im_start|>", "assistant", "A", "<|im_end|>", "<|im_start|>", "user", "Q", "<|im_end|>",
        "<|im_start|>", "assistant"])


def test_chat_prompt_with_only_imports_asks_for_the_answer(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/></prompt>', CHATML_MARKUP, tokenizer=tok)

    assert prompt_part(tok, plan) == ("decode", 9, ["<|im_start|>", "assistant"])


def test_space_between_role_tags_adds_no_turn(tok):
    plan = plan_of(CHAT, '<prompt schema="c"><doc/><user>Hi</user> <assistant>Yo</assistant></prompt>',
                   CHATML_MARKUP, tokenizer=tok)

    assert prompt_part(tok, plan) == ("decode", 9, ["<|im_start|>", "user", "Hi", "<|im_end|>",
                                                  "<|im_start|>", "assistant", "Yo"])


# --- the last token -----------------------------------------------------------------------------

def test_all_cached_prompt_recomputes_its_last_token(tok):
    plan = plan_of('<schema name="s"><module name="a">A1 A2</module></schema>', '<prompt schema="s"><a/></prompt>',
                   tokenizer=tok)

    assert steps(tok, plan) == [("copy", ROOT, 0, ["<bos>"]), ("copy", "a", 1, ["A1"]), ("decode", 2, ["A2"])]
    assert plan.ops[-1] == DecodeTokens(2, plan.ops[-1].tokens, "last token of module 'a'", recomputes="a")
    assert (plan.cached_tokens, plan.uncached_tokens, plan.end) == (2, 1, 3)
    # The baseline computes `a` whole, as its encoding did, then its last token again, as the prompt does.
    assert plan.calls == ((0, 1), (1, 3), (2, 3))


def test_all_cached_one_token_module_becomes_one_decode(tok):
    plan = plan_of('<schema name="s"><module name="a">A</module></schema>', '<prompt schema="s"><a/></prompt>',
                   tokenizer=tok)

    assert steps(tok, plan) == [("copy", ROOT, 0, ["<bos>"]), ("decode", 1, ["A"])]


def test_empty_prompt_without_bos_is_an_error():
    tok = WordTokenizer(bos=False)
    layout = layout_of('<schema name="s"><module name="a">A</module></schema>', tokenizer=tok)

    with pytest.raises(PromptError, match="the prompt is empty: import a module or write some text"):
        build_plan(layout, parse_prompt('<prompt schema="s"></prompt>'), tok, CHATML_MARKUP)


def test_plan_of_only_the_bos_decodes_it(tok):
    plan = plan_of('<schema name="s"><module name="a">A</module></schema>', '<prompt schema="s"/>', tokenizer=tok)

    assert steps(tok, plan) == [("decode", 0, ["<bos>"])]


def test_modules_are_listed_in_position_order_root_first():
    plan = plan_of('<schema name="s"><module name="a"><module name="b">B</module> A</module>'
                   '<module name="c">C</module></schema>', '<prompt schema="s"><a><b/></a><c/></prompt>')

    assert plan.modules == (ROOT, "a", "b", "c")


# --- scaffolds ----------------------------------------------------------------------------------

# <bos> "Docs :" 0-3 | scaffold both [3, 7): a "A a" 3-5, b "B" 5 with c "C" 6 | d "D" 7
SCAFFOLD = ('<schema name="s">Docs: <scaffold name="both"><module name="a">A a</module><module name="b">B '
            '<module name="c">C</module></module></scaffold><module name="d">D</module></schema>')


def scaffold_plan(body: str, tok: WordTokenizer | None = None) -> Plan:
    return plan_of(SCAFFOLD, f'<prompt schema="s">{body}</prompt>', tokenizer=tok)


def test_importing_every_scaffold_member_shares_the_joint_encoding(tok):
    plan = scaffold_plan('<a/><b><c/></b>Q', tok)

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>", "Docs", ":"]),
        ("copy", "a", 3, ["A", "a"], "scaffold:both"),
        ("copy", "b", 5, ["B"], "scaffold:both"),
        ("copy", "c", 6, ["C"], "scaffold:both"),
        ("decode", 7, ["Q"]),
    ]
    assert plan.modules == (ROOT, "a", "b", "c")
    assert [plan.encoding_of(m) for m in plan.modules] == [ROOT, "scaffold:both", "scaffold:both", "scaffold:both"]
    assert plan.ops[1].encoding == "scaffold:both"


def test_a_scaffold_s_members_are_one_call_of_the_baseline_and_its_other_modules_one_each(tok):
    assert scaffold_plan('<a/><b><c/></b>Q', tok).calls == ((0, 3), (3, 7), (7, 8))
    assert scaffold_plan('<a/><b/><d/>Q', tok).calls == ((0, 3), (3, 5), (5, 6), (6, 7), (7, 8))


def test_importing_a_scaffold_by_name_imports_all_its_members(tok):
    assert steps(tok, scaffold_plan('<both/>Q', tok)) == steps(tok, scaffold_plan('<a/><b><c/></b>Q', tok))
    assert scaffold_plan('<both/>Q').modules == (ROOT, "a", "b", "c")


def test_importing_some_scaffold_members_uses_their_own_encodings(tok):
    plan = scaffold_plan('<a/><b/><d/>Q', tok)  # c is left out

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>", "Docs", ":"]),
        ("copy", "a", 3, ["A", "a"]),
        ("copy", "b", 5, ["B"]),
        ("copy", "d", 7, ["D"]),
        ("decode", 8, ["Q"]),
    ]


def test_all_cached_scaffold_recomputes_its_last_token(tok):
    plan = scaffold_plan('<both/>', tok)

    assert steps(tok, plan)[-2:] == [("copy", "b", 5, ["B"], "scaffold:both"), ("decode", 6, ["C"])]
    assert plan.ops[-1].what == "last token of module 'c'"
    assert plan.calls == ((0, 3), (3, 7), (6, 7))  # the joint encoding's one call, then c again


def test_scaffold_import_takes_no_arguments():
    error = plan_error(SCAFFOLD, '<prompt schema="s"><both x="1"/></prompt>')

    assert str(error) == ("scaffold import <both/> takes no arguments or nested imports; import its modules one "
                          "by one to pass arguments (a, b, c) (line 1)")


def test_scaffold_import_in_the_wrong_place():
    error = plan_error(SCAFFOLD, '<prompt schema="s"><d><both/></d></prompt>')

    assert "scaffold 'both' must be imported at the top level, outside other imports" in str(error)
    error = plan_error('<schema name="s"><module name="m">M <scaffold name="x"><module name="a">A</module>'
                       '</scaffold></module></schema>', '<prompt schema="s"><x/></prompt>')
    assert "scaffold 'x' must be imported inside the import of module 'm', as <m><x/></m>" in str(error)


def test_scaffold_import_of_modules_with_params_is_refused():
    error = plan_error('<schema name="s"><scaffold name="x"><module name="a">A <param name="p" len="2"/></module>'
                       '</scaffold></schema>', '<prompt schema="s"><x/></prompt>')

    assert "scaffold 'x' holds module 'a', which needs arguments for p; import the modules one by one" in str(error)


def test_scaffold_and_its_member_imported_together():
    error = plan_error(SCAFFOLD, '<prompt schema="s"><a/><both/></prompt>')

    assert "module 'a' is imported twice (also by scaffold 'both'); import it once" in str(error)
    error = plan_error(SCAFFOLD, '<prompt schema="s"><both/><a/></prompt>')
    assert "module 'a' is imported twice; import it once" in str(error)


def test_scaffold_member_arguments_are_decoded_between_joint_cells(tok):
    plan = plan_of('<schema name="s"><scaffold name="x"><module name="a">A <param name="p" len="2"/> z</module>'
                   '<module name="b">B</module></scaffold></schema>',
                   '<prompt schema="s"><a p="hi"/><b/>Q</prompt>', tokenizer=tok)

    assert steps(tok, plan) == [
        ("copy", ROOT, 0, ["<bos>"]),
        ("copy", "a", 1, ["A"], "scaffold:x"),
        ("decode", 2, ["hi"]),
        ("copy", "a", 4, ["z"], "scaffold:x"),
        ("copy", "b", 5, ["B"], "scaffold:x"),
        ("decode", 6, ["Q"]),
    ]


def test_nested_scaffolds_use_the_outer_one_when_both_are_complete(tok):
    schema = ('<schema name="s"><scaffold name="outer"><module name="a">A</module><scaffold name="inner">'
              '<module name="b">B</module><module name="c">C</module></scaffold></scaffold></schema>')

    full = plan_of(schema, '<prompt schema="s"><outer/>Q</prompt>', tokenizer=tok)
    inner_only = plan_of(schema, '<prompt schema="s"><inner/>Q</prompt>', tokenizer=tok)

    assert {op.source for op in full.ops if isinstance(op, CopyCells) and op.module != ROOT} == {"scaffold:outer"}
    assert [(op.module, op.source) for op in inner_only.ops if isinstance(op, CopyCells)] == [
        (ROOT, None), ("b", "scaffold:inner"), ("c", "scaffold:inner")]


# --- imports in any order --------------------------------------------------------------------------

PACK = ('<schema name="s"><system>Sys</system><user><module name="a">A1 A2</module><module name="b">B1 B2 B3'
        '</module><module name="c">C1</module></user></schema>')


def test_imports_in_schema_order_keep_their_schema_positions_and_gaps():
    plan = plan_of(PACK, '<prompt schema="s"><a/><c/>Q</prompt>')
    layout = layout_of(PACK)
    copies = [op for op in plan.ops if isinstance(op, CopyCells) and op.module != ROOT]
    assert [(op.module, op.start, op.moved) for op in copies] == [
        ("a", layout.modules["a"].start, False), ("c", layout.modules["c"].start, False)]  # b's gap stays


def test_imports_out_of_order_are_packed_in_the_written_order():
    schema_order = plan_of(PACK, '<prompt schema="s"><a/><b/><c/>Q</prompt>')
    packed = plan_of(PACK, '<prompt schema="s"><c/><a/>Q</prompt>')
    layout = layout_of(PACK)
    shared = [op for op in packed.ops if isinstance(op, CopyCells) and op.module != ROOT]
    assert [op.module for op in shared] == ["c", "a"]
    c, a = shared
    assert c.start == layout.preamble_end and c.home == layout.modules["c"].start  # moved forward
    assert a.start == c.end and a.home == layout.modules["a"].start  # right after c: no gap
    assert packed.modules == (ROOT, "c", "a")
    # The same module tokens, ROOT's closing markup, then the prompt text, with nothing between.
    assert list(packed.positions) == list(range(len(packed.tokens)))
    assert packed.tokens[-1] == schema_order.tokens[-1]


def test_select_recompute_needs_schema_order():
    from pc_cpu.pml.recompute import parse_policy

    with pytest.raises(PromptError, match="schema order"):
        tokenizer = WordTokenizer()
        build_plan(layout_of(PACK, tokenizer=tokenizer), parse_prompt('<prompt schema="s"><b/><a/>Q</prompt>'),
                   tokenizer, PLAIN_MARKUP, parse_policy("select:10%"))
