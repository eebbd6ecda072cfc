"""Chat messages to PML: imports hoisted, text escaped, roles mapped (no model needed)."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptError
from pc_cpu.pml.chat import ChatMessage
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.server.chat import cleaned_text, messages_to_pml, split_imports

NAMES = {"doc", "plan", "tokyo", "paris"}


def test_an_import_then_a_question_becomes_imports_first_then_the_user_turn():
    pml = messages_to_pml("s", [ChatMessage("user", "<doc/> What does it say?")], import_names=NAMES)
    assert pml == '<prompt schema="s"><doc/><user>What does it say?</user></prompt>'


def test_imports_of_every_message_are_hoisted_in_order_and_deduplicated():
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "<doc/> Summarise."),
                ChatMessage("assistant", "Boats."), ChatMessage("user", 'Now <plan days="3 days"><tokyo/></plan> and <doc/>?')]
    pml = messages_to_pml("s", messages, import_names=NAMES)
    assert pml == ('<prompt schema="s"><doc/><plan days="3 days"><tokyo/></plan>'
                   '<system>Be brief.</system><user>Summarise.</user><assistant>Boats.</assistant>'
                   '<user>Now  and ?</user></prompt>')
    prompt = parse_prompt(pml)
    assert [i.name for i in prompt.imports] == ["doc", "plan"]
    assert prompt.imports[1].args == {"days": "3 days"} and prompt.imports[1].children[0].name == "tokyo"
    assert [(t.role, t.text) for t in prompt.turns] == [("system", "Be brief."), ("user", "Summarise."),
                                                        ("assistant", "Boats."), ("user", "Now  and ?")]


def test_text_that_is_not_an_import_reaches_the_prompt_exactly():
    text = 'if a < b && c > d: <b>bold</b> "quoted"\n  indented\r\nline &#10; <doc'
    pml = messages_to_pml("s", [ChatMessage("user", text)], import_names=NAMES)
    (turn,) = parse_prompt(pml).turns
    assert turn.text == text.replace("\r\n", "\n")


def test_a_message_of_only_imports_adds_no_turn_and_developer_is_system():
    pml = messages_to_pml("s", [ChatMessage("developer", "Rules."), ChatMessage("user", " <doc/> ")], import_names=NAMES)
    assert pml == '<prompt schema="s"><doc/><system>Rules.</system></prompt>'


def test_a_last_assistant_message_is_left_open_for_the_model_to_continue():
    prompt = parse_prompt(messages_to_pml("s", [ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello,")],
                                          import_names=NAMES))
    assert prompt.ends_with_assistant()


@pytest.mark.parametrize("messages, message", [
    ([], "messages is empty"),
    ([ChatMessage("tool", "x")], "role 'tool'; supported roles: system, developer, user, assistant"),
    ([ChatMessage("user", "<plan><tokyo/> Go")], "import <plan> is never closed"),
])
def test_bad_conversations_are_prompt_errors(messages, message):
    with pytest.raises(PromptError, match=message):
        messages_to_pml("s", messages, import_names=NAMES)


def test_split_imports_keeps_nested_imports_of_the_same_name_balanced():
    imports, rest = split_imports("<plan><plan/></plan>tail", {"plan"})
    assert imports == ["<plan><plan/></plan>"] and rest == "tail"


def test_cleaned_text_drops_characters_xml_cannot_carry():
    assert cleaned_text("a\x00b\x1fc\td") == "abc\td"
