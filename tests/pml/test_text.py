"""pc_cpu.pml.text: check_utf8 names a lone surrogate with its position; escape_text writes text into PML exactly."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pc_cpu.errors import DocumentError, PMLSyntaxError, PromptCacheError, PromptError
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.schema import parse_schema
from pc_cpu.pml.text import check_utf8, escape_attribute, escape_text
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


@pytest.mark.parametrize("text", ["a < b & c > d", "line one\nline two\r\n  indented\n", '"quoted" \'x\'\ttab', "\n\n"])
def test_escaped_text_and_attributes_parse_back_to_exactly_the_text(text):
    element = ET.fromstring(f'<p a="{escape_attribute(text)}">{escape_text(text)}</p>')
    assert element.text == text and element.get("a") == text


def test_a_character_xml_cannot_carry_is_refused_naming_it_and_where():
    with pytest.raises(PromptError, match=r"the note holds U\+0007 at character 3, which XML cannot carry"):
        escape_text("ab\x07c", "the note")
