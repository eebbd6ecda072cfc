"""Tests of prompt parsing (pc_cpu.pml.prompt): imports, arguments and free text."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PMLSyntaxError, PromptError
from pc_cpu.pml.prompt import Import, Turn, parse_prompt


def prompt_error(pml: str) -> PromptError:
    with pytest.raises(PromptError) as info:
        parse_prompt(pml)
    return info.value


def test_imports_args_nesting_and_a_user_turn():
    prompt = parse_prompt('<prompt schema="trip">\n'
                          '  <plan days="3 days"><paris/></plan>\n'
                          '  <extra/>\n'
                          '  <user>Where can I surf?</user>\n'
                          '</prompt>')

    assert prompt.schema == "trip"
    assert prompt.imports == (
        Import("plan", {"days": "3 days"}, (Import("paris", {}, (), 2),), 2),
        Import("extra", {}, (), 3),
    )
    assert prompt.turns == (Turn("user", "Where can I surf?", 4),)
    assert prompt.uses_roles
    assert not prompt.ends_with_assistant()


def test_import_args_are_read_only():
    prompt = parse_prompt('<prompt schema="s"><m a="1"/></prompt>')

    with pytest.raises(TypeError):
        prompt.imports[0].args["a"] = "2"  # type: ignore[index]


def test_args_keep_escaped_text_and_written_newlines():
    prompt = parse_prompt('<prompt schema="s"><m a="x &lt; y &amp; z" b="one&#10;two"/></prompt>')

    assert dict(prompt.imports[0].args) == {"a": "x < y & z", "b": "one\ntwo"}


def test_deeply_nested_imports():
    prompt = parse_prompt('<prompt schema="s"><a><b><c x="1"/></b><d/></a></prompt>')

    (a,) = prompt.imports
    assert [c.name for c in a.children] == ["b", "d"]
    assert a.children[0].children == (Import("c", {"x": "1"}, (), 1),)


def test_prompt_with_only_imports_has_no_turns():
    prompt = parse_prompt('<prompt schema="s">\n  <a/>\n  <b/>\n</prompt>')

    assert [i.name for i in prompt.imports] == ["a", "b"]
    assert prompt.turns == ()
    assert not prompt.uses_roles


def test_spaces_between_imports_are_not_text():
    prompt = parse_prompt('<prompt schema="s"><a/> <b/>  </prompt>')

    assert [i.name for i in prompt.imports] == ["a", "b"]
    assert prompt.turns == ()


def test_free_text_outside_roles_has_no_role():
    prompt = parse_prompt('<prompt schema="s"><a/>\n  What now?\n</prompt>')

    assert prompt.turns == (Turn(None, "What now?", 2),)  # the line the text is written on
    assert not prompt.uses_roles


def test_free_text_split_by_a_comment_is_one_turn():
    prompt = parse_prompt('<prompt schema="s">Hello <!-- aside --> world</prompt>')

    assert prompt.turns == (Turn(None, "Hello  world", 1),)


def test_role_turns_in_order_with_text_between():
    prompt = parse_prompt('<prompt schema="s">Intro <user>Q</user> tail<assistant>A</assistant></prompt>')

    assert prompt.turns == (Turn(None, "Intro ", 1), Turn("user", "Q", 1), Turn(None, " tail", 1),
                            Turn("assistant", "A", 1))
    assert prompt.ends_with_assistant()


def test_imports_inside_a_role_before_its_text():
    prompt = parse_prompt('<prompt schema="s"><user><doc/>Question</user><assistant>Answer</assistant></prompt>')

    assert prompt.imports == (Import("doc", {}, (), 1),)
    assert prompt.turns == (Turn("user", "Question", 1), Turn("assistant", "Answer", 1))


def test_empty_role_tag_marks_roles_in_use_without_a_turn():
    prompt = parse_prompt('<prompt schema="s"><a/><user></user></prompt>')

    assert prompt.uses_roles
    assert prompt.turns == ()


def test_indentation_between_role_tags_is_dropped():
    prompt = parse_prompt('<prompt schema="s">\n  <user>Hi</user>\n  <assistant>Yo</assistant>\n</prompt>')

    assert prompt.turns == (Turn("user", "Hi", 2), Turn("assistant", "Yo", 3))


def test_spaces_between_role_tags_are_not_a_turn():
    prompt = parse_prompt('<prompt schema="s"><user>Hi</user> <assistant>Yo</assistant></prompt>')

    assert prompt.turns == (Turn("user", "Hi", 1), Turn("assistant", "Yo", 1))


def test_two_user_tags_in_a_row_keep_their_words_apart():
    prompt = parse_prompt('<prompt schema="s"><user>Hi</user><user>there</user></prompt>')

    assert " ".join(t.text for t in prompt.turns).split() == ["Hi", "there"]
    assert all(t.role == "user" for t in prompt.turns)


# --- errors -------------------------------------------------------------------------------------

def test_text_before_an_import():
    error = prompt_error('<prompt schema="s">\nHello\n<doc/></prompt>')

    assert "text 'Hello'" in str(error)
    assert "comes before the import <doc/>" in str(error)
    assert "free text must follow all imports: move the text after it" in str(error)
    assert error.line == 3


def test_text_before_an_import_names_the_text_line():
    error = prompt_error('<prompt schema="s">\nHello\n<doc/></prompt>')

    assert "text 'Hello' (line 2)" in str(error)


def test_role_text_before_an_import():
    error = prompt_error('<prompt schema="s"><user>Q</user><doc/></prompt>')

    assert "text 'Q'" in str(error) and "comes before the import <doc/>" in str(error)


def test_role_tag_inside_an_import():
    error = prompt_error('<prompt schema="s"><doc><user>x</user></doc></prompt>')

    assert "<user> is inside the import <doc>; put role tags at the top level of the prompt" in str(error)


def test_text_inside_an_import():
    error = prompt_error('<prompt schema="s">\n<doc>\n  some text</doc></prompt>')

    assert "import <doc> contains text 'some text'" in str(error)
    assert "an import holds only nested imports" in str(error)


def test_role_inside_a_role():
    error = prompt_error('<prompt schema="s"><user>a <assistant>b</assistant></user></prompt>')

    assert "<assistant> is inside <user>; close <user> first" in str(error)


def test_role_with_attributes():
    error = prompt_error('<prompt schema="s"><user name="bob">x</user></prompt>')

    assert "<user> takes no attributes" in str(error)


@pytest.mark.parametrize("root", ['<prompt>x</prompt>', '<prompt schema="">x</prompt>'])
def test_missing_schema_attribute(root):
    error = prompt_error(root)

    assert '<prompt> needs a schema attribute naming a loaded schema, e.g. <prompt schema="trip">' in str(error)


def test_unknown_prompt_attribute():
    error = prompt_error('<prompt schema="s" model="x">hi</prompt>')

    assert "<prompt> has unknown attribute 'model'; allowed: schema" in str(error)


def test_root_must_be_prompt():
    error = prompt_error('<schema name="s">x</schema>')

    assert 'root element is <schema>; a prompt starts with <prompt schema="...">' in str(error)


def test_malformed_prompt_is_a_syntax_error_with_a_line():
    with pytest.raises(PMLSyntaxError) as info:
        parse_prompt('<prompt schema="s">\n<doc>\n</prompt>')

    assert "prompt is not well-formed XML: mismatched tag" in str(info.value)
    assert info.value.line == 3


def test_non_utf8_prompt():
    with pytest.raises(PMLSyntaxError, match="prompt is not UTF-8 text"):
        parse_prompt(b'<prompt schema="s">\xc3\x28</prompt>')
