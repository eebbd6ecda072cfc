"""Tests of schema parsing (pc_cpu.pml.schema) and safe XML reading (pc_cpu.pml.xmltree)."""

from __future__ import annotations

import dataclasses

import pytest

from pc_cpu.errors import PMLSyntaxError, PromptCacheError, SchemaError
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.schema import (MAX_PARAM_LEN, RESERVED_NAMES, ModuleNode, ParamNode, RoleNode, ScaffoldNode,
                               TextNode, UnionNode, normalize_text, parse_schema, render_schema, walk)
from pc_cpu.pml import xmltree
from pc_cpu.pml.xmltree import MAX_DEPTH
from tests.pml.conftest import TRIP


def schema_error(pml: str) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        parse_schema(pml)
    return info.value


def syntax_error(pml) -> PMLSyntaxError:
    with pytest.raises(PMLSyntaxError) as info:
        parse_schema(pml)
    return info.value


# --- parsing ------------------------------------------------------------------------------------

def without_text_lines(nodes):
    """Returns `nodes` with every TextNode's line set to 0 (text lines are checked on their own)."""
    out = []
    for node in nodes:
        if isinstance(node, TextNode):
            out.append(dataclasses.replace(node, line=0))
        elif isinstance(node, UnionNode):
            out.append(dataclasses.replace(node, members=without_text_lines(node.members)))
        elif isinstance(node, ParamNode):
            out.append(node)
        else:
            out.append(dataclasses.replace(node, children=without_text_lines(node.children)))
    return tuple(out)


def test_trip_schema_parses_into_the_expected_tree():
    schema = parse_schema(TRIP)

    assert schema.name == "trip"
    assert schema.source == TRIP
    assert without_text_lines(schema.children) == (
        TextNode("Trips:", 0),
        ModuleNode("plan", (
            TextNode("Plan ", 0),
            ParamNode("days", 4, 3),
            TextNode(" days in", 0),
            UnionNode("city", (
                ModuleNode("paris", (TextNode("Paris is nice", 0),), 5),
                ModuleNode("tokyo", (TextNode("Tokyo", 0),), 6),
            ), 4),
        ), 3),
        TextNode("Bye", 0),
    )
    assert not schema.uses_roles()


def without_lines(nodes):
    """Returns `nodes` with every line set to 0, at every depth."""
    out = []
    for node in nodes:
        if isinstance(node, UnionNode):
            node = dataclasses.replace(node, members=without_lines(node.members))
        elif not isinstance(node, (TextNode, ParamNode)):
            node = dataclasses.replace(node, children=without_lines(node.children))
        out.append(dataclasses.replace(node, line=0))
    return tuple(out)


EVERY_KIND = """<schema name="all">
  <system>Be brief &amp; exact.&#10;Say "why" &lt;here&gt;.</system>
  <module name="a" recompute="head:4">A <param name="p" len="3"/> tab	end</module>
  <union><module name="b">B</module><module name="c">C</module></union>
  <union name="named"><module name="d" recompute="10%">D</module></union>
  <scaffold name="s"><module name="e">E</module> between </scaffold>
  <user>Q&#10;&#10;</user>
</schema>"""


def test_a_rendered_schema_parses_back_to_the_same_nodes():
    schema = parse_schema(EVERY_KIND)
    rendered = render_schema(schema.name, schema.children)
    again = parse_schema(rendered)
    assert again.name == "all"
    assert without_lines(again.children) == without_lines(schema.children)
    assert render_schema(again.name, again.children) == rendered


def test_render_writes_a_parser_named_union_unnamed_and_keeps_given_names():
    rendered = render_schema("x", parse_schema(EVERY_KIND).children)
    assert "<union><module name=\"b\">" in rendered
    assert "<union name=\"named\">" in rendered
    assert "#union" not in rendered


def test_text_nodes_carry_the_line_where_the_text_starts():
    schema = parse_schema(TRIP)

    assert schema.children[0] == TextNode("Trips:", 2)
    assert schema.children[-1] == TextNode("Bye", 9)


def test_nested_modules_keep_document_order_in_walk():
    schema = parse_schema('<schema name="s"><module name="a">A<module name="b">B<module name="c">C'
                          '</module></module></module><module name="d">D</module></schema>')

    names = [n.name for n in walk(schema.children) if isinstance(n, ModuleNode)]
    assert names == ["a", "b", "c", "d"]
    a = schema.children[0]
    assert a.children[0] == TextNode("A", 1)
    assert a.children[1].name == "b"
    assert a.children[1].children[1].name == "c"


def test_unions_get_default_names_in_order_and_keep_given_names():
    schema = parse_schema('<schema name="s">'
                          '<union><module name="a">A</module><module name="b">B</module></union>'
                          '<union name="pick"><module name="c">C</module></union>'
                          '<union><module name="d">D</module></union>'
                          '</schema>')

    unions = [n for n in schema.children if isinstance(n, UnionNode)]
    assert [u.name for u in unions] == ["#union1", "pick", "#union3"]  # "#": never a user-written name
    assert [m.name for m in unions[0].members] == ["a", "b"]


def test_params_carry_name_and_len():
    schema = parse_schema(f'<schema name="s"><module name="m"><param name="x" len="1"/> and '
                          f'<param name="y" len="{MAX_PARAM_LEN}"/></module></schema>')

    params = [n for n in walk(schema.children) if isinstance(n, ParamNode)]
    assert params == [ParamNode("x", 1, 1), ParamNode("y", MAX_PARAM_LEN, 1)]


def test_same_param_name_in_two_modules_is_fine():
    schema = parse_schema('<schema name="s"><module name="a"><param name="x" len="2"/></module>'
                          '<module name="b"><param name="x" len="3"/></module></schema>')

    assert [n.length for n in walk(schema.children) if isinstance(n, ParamNode)] == [2, 3]


def test_roles_hold_text_and_modules():
    schema = parse_schema('<schema name="s"><system>Be brief.</system>'
                          '<user><module name="q">Question</module></user><assistant>Ok</assistant></schema>')

    assert schema.uses_roles()
    assert schema.children == (
        RoleNode("system", (TextNode("Be brief.", 1),), 1),
        RoleNode("user", (ModuleNode("q", (TextNode("Question", 1),), 1),), 1),
        RoleNode("assistant", (TextNode("Ok", 1),), 1),
    )


def test_scaffold_holds_modules_and_text():
    schema = parse_schema('<schema name="s"><scaffold name="both">Docs: <module name="a">A</module>'
                          '<module name="b">B</module></scaffold></schema>')

    assert schema.children == (
        ScaffoldNode("both", (TextNode("Docs: ", 1), ModuleNode("a", (TextNode("A", 1),), 1),
                              ModuleNode("b", (TextNode("B", 1),), 1)), 1),
    )


def test_scaffold_may_hold_a_union():
    schema = parse_schema('<schema name="s"><scaffold name="sc"><union name="u"><module name="a">A</module>'
                          '</union></scaffold></schema>')

    assert isinstance(schema.children[0].children[0], UnionNode)


def test_bytes_source_is_decoded_and_kept_as_text():
    schema = parse_schema('<schema name="s"><module name="m">café</module></schema>'.encode())

    assert schema.source == '<schema name="s"><module name="m">café</module></schema>'
    assert schema.children[0].children == (TextNode("café", 1),)


def test_comments_and_processing_instructions_are_ignored():
    schema = parse_schema('<schema name="s"><module name="m">one <!-- note --> two<?pi x?></module></schema>')

    assert schema.children[0].children == (TextNode("one  two", 1),)


def test_escaped_markup_is_literal_text():
    schema = parse_schema('<schema name="s"><module name="m">a &lt;b&gt; &amp; c</module></schema>')

    assert schema.children[0].children == (TextNode("a <b> & c", 1),)


# --- text normalisation -------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("\n    ", ""),  # whitespace-only with a newline: indentation, dropped
    ("  \t ", "  \t "),  # whitespace-only without a newline: kept
    ("\n    Hello\n  ", "Hello"),  # one leading and one trailing newline+indent trimmed
    ("  \n  Hello", "Hello"),  # spaces before the newline belong to the indent
    ("\n\n  Hello", "\n  Hello"),  # only one leading newline is trimmed
    ("Hello\n\n", "Hello\n"),  # only one trailing newline is trimmed
    ("Hello\n  world", "Hello\n  world"),  # inner newlines stay
    (" Plan ", " Plan "),  # spaces without newlines stay
    ("a\r\n  ", "a"),
])
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected


def test_indentation_between_elements_is_dropped_and_inline_spaces_kept():
    schema = parse_schema('<schema name="s">\n  <module name="a">\n    Alpha\n  </module>\n'
                          '  <module name="b"> Beta </module>\n</schema>')

    assert without_text_lines(schema.children) == (
        ModuleNode("a", (TextNode("Alpha", 0),), 2),
        ModuleNode("b", (TextNode(" Beta ", 0),), 5),
    )


def test_char_reference_newline_inside_text_stays():
    schema = parse_schema('<schema name="s"><module name="m">one&#10;two</module></schema>')

    assert schema.children[0].children == (TextNode("one\ntwo", 1),)


def test_char_reference_newline_at_end_of_text_stays():
    schema = parse_schema('<schema name="s"><module name="m">Line one&#10;</module></schema>')

    assert schema.children[0].children == (TextNode("Line one\n", 1),)


def test_char_reference_newline_at_start_of_text_stays():
    schema = parse_schema('<schema name="s"><module name="m">&#10;Line two</module></schema>')

    assert schema.children[0].children == (TextNode("\nLine two", 1),)


@pytest.mark.parametrize("ref", ["&#10;", "&#xA;", "&#x0a;"])
def test_char_reference_newline_alone_is_kept(ref):
    schema = parse_schema(f'<schema name="s"><module name="m">A</module><module name="n">{ref}</module></schema>')

    assert schema.children[1].children == (TextNode("\n", 1),)


def test_char_reference_newline_with_leading_zero_stays():
    schema = parse_schema('<schema name="s"><module name="m">Line one&#010;</module></schema>')

    assert schema.children[0].children == (TextNode("Line one\n", 1),)


def test_private_use_character_in_text_is_kept():
    schema = parse_schema('<schema name="s"><module name="m">a\ue000b</module></schema>')

    assert schema.children[0].children == (TextNode("a\ue000b", 1),)


def test_cdata_is_literal_text():
    schema = parse_schema('<schema name="s"><module name="m"><![CDATA[a <b> & c]]></module></schema>')

    assert schema.children[0].children == (TextNode("a <b> & c", 1),)


def test_char_reference_inside_cdata_stays_literal():
    schema = parse_schema('<schema name="s"><module name="m"><![CDATA[a &#10; b]]></module></schema>')

    assert schema.children[0].children == (TextNode("a &#10; b", 1),)


# --- SchemaError: names -------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_reserved_module_names_are_refused(name):
    error = schema_error(f'<schema name="s"><module name="{name}">x</module></schema>')

    assert f"module name {name!r} is reserved" in str(error)
    assert "rename the module" in str(error)
    assert error.line == 1


@pytest.mark.parametrize("body, tag", [
    ('<module>x</module>', "module"),
    ('<scaffold><module name="a">A</module></scaffold>', "scaffold"),
])
def test_missing_name_says_how_to_write_it(body, tag):
    error = schema_error(f'<schema name="s">{body}</schema>')

    assert f'<{tag}> needs a name attribute, e.g. <{tag} name="docs">' in str(error)


def test_union_with_an_empty_name_gets_a_default_name():
    schema = parse_schema('<schema name="s"><union name=""><module name="a">A</module></union></schema>')

    assert schema.children[0].name == "#union1"


def test_schema_needs_a_name():
    error = schema_error('<schema>x</schema>')

    assert '<schema> needs a name attribute' in str(error)


def test_param_needs_a_name():
    error = schema_error('<schema name="s"><module name="m"><param len="2"/></module></schema>')

    assert '<param> needs a name attribute' in str(error)


@pytest.mark.parametrize("bad", ["1abc", "a b", "a:b", "-x"])
def test_names_must_be_xml_names(bad):
    error = schema_error(f'<schema name="s"><module name="{bad}">x</module></schema>')

    assert f"module name {bad!r} is not an XML name" in str(error)
    assert "start with a letter or '_'" in str(error)


def test_duplicate_module_names_point_at_the_first():
    error = schema_error('<schema name="s">\n<module name="a">x</module>\n<module name="b">'
                         '<module name="a">y</module></module>\n</schema>')

    assert "module name 'a' is used twice (first on line 2)" in str(error)
    assert "module names must be unique" in str(error)
    assert error.line == 3


def test_duplicate_module_names_across_union_members():
    error = schema_error('<schema name="s"><union><module name="a">x</module><module name="a">y</module>'
                         '</union></schema>')

    assert "module name 'a' is used twice" in str(error)


@pytest.mark.parametrize("second", ['<union name="x"><module name="b">B</module></union>',
                                    '<scaffold name="x"><module name="b">B</module></scaffold>'])
def test_union_or_scaffold_reusing_a_module_name(second):
    error = schema_error(f'<schema name="s"><module name="x">A</module>{second}</schema>')

    assert "name 'x' is used twice; union, scaffold and module names must be unique" in str(error)


def test_two_unions_with_one_name():
    error = schema_error('<schema name="s"><union name="u"><module name="a">A</module></union>'
                         '<union name="u"><module name="b">B</module></union></schema>')

    assert "name 'u' is used twice" in str(error)


def test_module_reusing_a_union_name_is_refused():
    error = schema_error('<schema name="s"><union name="u"><module name="a">x</module></union>'
                         '<module name="u">y</module></schema>')

    assert "module name 'u' is used twice" in str(error)


def test_module_reusing_a_union_name_names_the_first_line():
    error = schema_error('<schema name="s">\n<union name="u"><module name="a">x</module></union>\n'
                         '<module name="u">y</module></schema>')

    assert "line ?" not in str(error)
    assert "line 2" in error.bare_message


def test_default_union_name_does_not_clash_with_a_module_name():
    schema = parse_schema('<schema name="s"><module name="union1">x</module>'
                          '<union><module name="a">A</module></union></schema>')

    assert [m.name for m in schema.children[1].members] == ["a"]


def test_duplicate_param_in_one_module():
    error = schema_error('<schema name="s"><module name="m"><param name="p" len="1"/> and '
                         '<param name="p" len="2"/></module></schema>')

    assert "param 'p' appears twice in module 'm'; give each param its own name" in str(error)


@pytest.mark.parametrize("body", [
    '<module name="m"><user><param name="p" len="1"/></user><param name="p" len="2"/></module>',
    '<module name="m"><param name="p" len="1"/><scaffold name="sc"><module name="n">N</module>'
    '<param name="p" len="2"/></scaffold></module>',
], ids=["in-role", "in-scaffold"])
def test_duplicate_param_in_one_module_behind_a_role_or_scaffold(body):
    error = schema_error(f'<schema name="s">{body}</schema>')

    assert "param 'p' appears twice in module 'm'" in str(error)


# --- SchemaError: params ------------------------------------------------------------------------

@pytest.mark.parametrize("attr, shown", [
    ('len="0"', "'0'"), ('len="-1"', "'-1'"), ('len="abc"', "'abc'"), ('len="1.5"', "'1.5'"),
    ('len="4097"', "'4097'"), ('', "None"),
])
def test_bad_param_len(attr, shown):
    error = schema_error(f'<schema name="s"><module name="m"><param name="p" {attr}/></module></schema>')

    assert f"param 'p' in module 'm' has len={shown}" in str(error)
    assert f"len must be a whole number of tokens from 1 to {MAX_PARAM_LEN}" in str(error)


def test_param_outside_module():
    error = schema_error('<schema name="s">\n<param name="p" len="2"/></schema>')

    assert "param 'p' is outside any module; put it inside the <module> it belongs to" in str(error)
    assert error.line == 2


def test_param_in_a_top_level_role_is_outside_any_module():
    error = schema_error('<schema name="s"><user><param name="p" len="2"/></user></schema>')

    assert "param 'p' is outside any module" in str(error)


def test_param_with_content():
    error = schema_error('<schema name="s"><module name="m"><param name="p" len="2">x</param></module></schema>')

    assert "param 'p' has content; write it as an empty tag <param name=\"p\" len=\"N\"/>" in str(error)


# --- SchemaError: unions ------------------------------------------------------------------------

def test_text_in_union():
    error = schema_error('<schema name="s"><union name="u">\n  stray words <module name="a">A</module></union>'
                         '</schema>')

    assert "union 'u' holds text 'stray words'" in str(error)
    assert "move the text into a module or outside the union" in str(error)


@pytest.mark.parametrize("inner, tag", [
    ('<param name="p" len="1"/>', "param"),
    ('<user>x</user>', "user"),
    ('<union><module name="b">B</module></union>', "union"),
    ('<scaffold name="sc"><module name="b">B</module></scaffold>', "scaffold"),
])
def test_non_module_in_union(inner, tag):
    error = schema_error(f'<schema name="s"><union name="u"><module name="a">A</module>{inner}</union></schema>')

    assert f"union 'u' holds <{tag}>; a union holds only <module> elements" in str(error)


def test_empty_union():
    error = schema_error('<schema name="s"><union name="u">\n</union></schema>')

    assert "union 'u' has no module; add <module> members or remove it" in str(error)


# --- SchemaError: elements, attributes, emptiness, roles ---------------------------------------

def test_root_must_be_schema():
    error = schema_error('<prompt schema="s"/>')

    assert "root element is <prompt>; a schema starts with <schema name=" in str(error)


def test_unknown_element():
    error = schema_error('<schema name="s">\n<module name="m">see <b>this</b></module></schema>')

    assert "unknown element <b> in a schema" in str(error)
    assert "write a literal '<' as &lt;" in str(error)
    assert error.line == 2


@pytest.mark.parametrize("element, attr, allowed", [
    ('<module name="m" id="3">x</module>', "id", "name"),
    ('<union name="u" kind="x"><module name="a">A</module></union>', "kind", "name"),
    ('<module name="m"><param name="p" len="2" default="x"/></module>', "default", "len, name"),
    ('<user lang="en">x</user>', "lang", "none"),
    ('<scaffold name="sc" mode="x"><module name="a">A</module></scaffold>', "mode", "name"),
])
def test_unknown_attribute(element, attr, allowed):
    error = schema_error(f'<schema name="s">{element}</schema>')

    assert f"has unknown attribute {attr!r}; allowed: {allowed}" in str(error)


def test_unknown_attribute_on_schema():
    error = schema_error('<schema name="s" version="2">x</schema>')

    assert "<schema> has unknown attribute 'version'; allowed: name" in str(error)


@pytest.mark.parametrize("content", ["", "\n    \n  "])
def test_empty_module(content):
    error = schema_error(f'<schema name="s"><module name="m">{content}</module></schema>')

    assert "module 'm' is empty; give it text or remove it" in str(error)


def test_scaffold_without_modules():
    error = schema_error('<schema name="s"><scaffold name="sc">just text</scaffold></schema>')

    assert "scaffold 'sc' holds no module; wrap the modules it should encode jointly" in str(error)


def test_scaffold_with_modules_inside_a_role():
    schema = parse_schema('<schema name="s"><scaffold name="sc"><user><module name="m">x</module></user>'
                          '</scaffold></schema>')

    assert schema.children[0].name == "sc"


@pytest.mark.parametrize("body", [
    '<user>a <assistant>b</assistant></user>',
    '<system><scaffold name="sc"><user>x</user><module name="m">y</module></scaffold></system>',
])
def test_nested_role_tags(body):
    error = schema_error(f'<schema name="s">{body}</schema>')

    assert "is inside another role tag; close the first role before opening" in str(error)


def test_nested_role_tags_through_a_module():
    error = schema_error('<schema name="s"><user><module name="m"><user>x</user></module></user></schema>')

    assert "<user> is inside another role tag" in str(error)


# --- PMLSyntaxError -----------------------------------------------------------------------------

def test_malformed_xml_gives_line_and_column():
    error = syntax_error('<schema name="s">\n<module name="a">x\n</schema>')

    assert "schema is not well-formed XML: mismatched tag" in str(error)
    assert "escape < & as &lt; &amp;" in str(error)
    assert (error.line, error.column) == (3, 3)
    assert str(error).endswith("(line 3, column 3)")


def test_bare_ampersand_is_a_syntax_error():
    error = syntax_error('<schema name="s">\n\nfish & chips</schema>')

    assert error.line == 3


def test_junk_after_root():
    error = syntax_error('<schema name="s">a</schema><x/>')

    assert "junk after document element" in str(error)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<schema name="s">&lol3;</schema>"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE schema [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<schema name="s"><module name="m">&xxe;</module></schema>"""


@pytest.mark.parametrize("pml", [BILLION_LAUGHS, EXTERNAL_ENTITY, '<!DOCTYPE schema><schema name="s">x</schema>'])
def test_dtds_and_entities_are_refused(pml):
    error = syntax_error(pml)

    assert "schema uses a refused XML feature" in str(error)
    assert "remove DTDs and entity declarations" in str(error)


def test_undefined_entity_is_a_syntax_error():
    error = syntax_error('<schema name="s">&lol;</schema>')

    assert "undefined entity" in str(error)


def test_non_utf8_bytes():
    error = syntax_error(b'<schema name="s">\xff</schema>')

    assert str(error) == "schema is not UTF-8 text: invalid start byte at byte 17"


@pytest.mark.parametrize("pml", ["", "   \n\t", b""])
def test_empty_input(pml):
    error = syntax_error(pml)

    assert str(error) == "schema is empty; expected a <schema> element"


def test_only_a_comment_has_no_element():
    error = syntax_error("<!-- nothing -->")

    assert "no element found" in str(error)


def test_wrong_type():
    error = syntax_error(42)

    assert str(error) == "schema must be a string of PML, got int"


def test_too_deep_nesting():
    depth = MAX_DEPTH + 1
    body = "".join(f'<module name="m{i}">' for i in range(depth)) + "x" + "</module>" * depth
    error = syntax_error(f'<schema name="s">\n{body}</schema>')

    assert f"elements nested deeper than {MAX_DEPTH}; flatten the document" in str(error)
    assert error.line == 2


def test_too_many_elements(monkeypatch):
    monkeypatch.setattr(xmltree, "MAX_ELEMENTS", 5)
    body = "".join(f'<module name="m{i}">x</module>' for i in range(5))  # 6 elements with <schema>
    error = syntax_error(f'<schema name="s">{body}</schema>')

    assert str(error) == "more than 5 elements; split the document (line 1)"


def test_too_much_text(monkeypatch):
    monkeypatch.setattr(xmltree, "MAX_TEXT_CHARS", 10)
    error = syntax_error('<schema name="s"><module name="m">0123456789A</module></schema>')

    assert str(error) == "more than 10 characters of text; shorten the document"


def test_nesting_just_under_the_limit_parses():
    depth = MAX_DEPTH - 1  # plus <schema>: exactly MAX_DEPTH open elements
    body = "".join(f'<module name="m{i}">' for i in range(depth)) + "x" + "</module>" * depth
    schema = parse_schema(f'<schema name="s">{body}</schema>')

    assert len([n for n in walk(schema.children) if isinstance(n, ModuleNode)]) == depth


def test_prompt_documents_get_the_same_xml_checks():
    with pytest.raises(PMLSyntaxError, match="prompt uses a refused XML feature"):
        parse_prompt(EXTERNAL_ENTITY.replace("schema", "prompt"))
    with pytest.raises(PMLSyntaxError, match="prompt is empty; expected a <prompt> element"):
        parse_prompt("")


def test_every_schema_error_is_a_prompt_cache_error():
    assert issubclass(SchemaError, PromptCacheError)
    assert issubclass(PMLSyntaxError, PromptCacheError)


@pytest.mark.parametrize("written, meant", [
    ("a&#xE000;1b", "a\ue0001b"),  # a referenced private-use character before a "1" is not a newline
    ("a\ue0000b", "a\ue0000b"),
    ("a&#10;\ue000&#xa;b", "a\n\ue000\nb"),
    ("<![CDATA[\ue0001 &#10;]]>", "\ue0001 &#10;"),
])
def test_written_newlines_and_private_use_characters_come_back_as_written(written, meant):
    schema = parse_schema(f'<schema name="s"><module name="m">{written}</module></schema>')

    assert schema.children[0].children == (TextNode(meant, 1),)
