"""pc_cpu.pml.text.check_utf8: a lone surrogate is named with its position; any other text passes untouched."""

from __future__ import annotations

import pytest

from pc_cpu.errors import DocumentError, PMLSyntaxError, PromptCacheError
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.schema import parse_schema
from pc_cpu.pml.text import check_utf8
from tests.pml.conftest import utf8_refusal


@pytest.mark.parametrize("text, at, code", [("\udc80", 1, "DC80"), ("ab\ud800", 3, "D800"),
                                            ("\U0001F6A4 then \udfff", 8, "DFFF")])
def test_a_lone_surrogate_is_named_with_its_position_counted_from_1(text, at, code):
    with pytest.raises(PromptCacheError, match=utf8_refusal("the note", at, code)):
        check_utf8(text, "the note")


@pytest.mark.parametrize("text", ["", "plain", "\U0001F6A4 a pair is one character", "\x00 controls encode"])
def test_text_utf8_can_encode_is_returned_as_it_is(text):
    assert check_utf8(text, "the note") is text


def test_the_error_class_is_the_callers():
    with pytest.raises(DocumentError):
        check_utf8("\udc80", "the note", error=DocumentError)


def test_pml_with_a_lone_surrogate_is_a_syntax_error_naming_the_document():
    with pytest.raises(PMLSyntaxError, match=utf8_refusal("the prompt", 20)):
        parse_prompt('<prompt schema="s">\udc80</prompt>')
    with pytest.raises(PMLSyntaxError, match=utf8_refusal("the schema", 18, "D800")):
        parse_schema('<schema name="s">\ud800</schema>')
