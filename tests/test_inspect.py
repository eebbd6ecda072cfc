"""Tests of the `pc-cpu inspect` views (pc_cpu.inspect): no model, the word tokenizer lays schemas out."""

from __future__ import annotations

from pc_cpu.inspect import kv_bytes_per_token, layout_json, layout_table, table_rows
from pc_cpu.pml.layout import build_layout
from pc_cpu.pml.roles import PLAIN_MARKUP
from pc_cpu.pml.schema import parse_schema
from tests.fake_tokenizer import WordTokenizer

# With BOS: 0 BOS | "Docs :" 1-3 | scaffold both [3, 11): a [3, 6) "A text" + a2 "inner" 5,
# ROOT "and" 6, b [7, 11) "B" p(2) "b" | plan [11, 15): "Plan", union city: paris 12-15, tokyo 12 | "Bye" 15
SCHEMA = """<schema name="s">Docs:
<scaffold name="both">
  <module name="a">A text <module name="a2">inner</module></module> and
  <module name="b">B <param name="p" len="2"/> b</module>
</scaffold>
<module name="plan">Plan
  <union name="city"><module name="paris">Paris is nice</module><module name="tokyo">Tokyo</module></union>
</module>
Bye</schema>"""
BPT = 1000  # bytes per token, round for the test


def layout():
    return build_layout(parse_schema(SCHEMA), WordTokenizer(), PLAIN_MARKUP)


def table_lines(bytes_per_token=BPT) -> list[list[str]]:
    return [line.split() for line in layout_table(layout(), bytes_per_token).splitlines()]


def row(lines, name):
    return next(line for line in lines if line[0] == name)


def test_bytes_per_token_of_an_f16_cache():
    # SmolLM2-135M: 30 layers, 3 KV heads of 64: K and V, 2 bytes each.
    assert kv_bytes_per_token(30, 3, 64) == 23040


def test_json_format_is_unchanged():
    data = layout_json(layout())
    assert set(data) == {"schema", "length", "nodes"} and data["schema"] == "s" and data["length"] == 16
    assert {"name": "both", "kind": "scaffold", "start": 3, "length": 8, "parent": None} in data["nodes"]
    assert all(set(n) == {"name", "kind", "start", "length", "parent"} for n in data["nodes"])


def test_table_columns_and_module_rows():
    lines = table_lines()
    assert lines[0] == ["node", "kind", "start", "end", "length", "tokens", "encoded", "state", "bytes"]
    assert row(lines, "a") == ["a", "module", "3", "6", "3", "2", "2", "2.0", "KiB"]
    assert row(lines, "b") == ["b", "module", "7", "11", "4", "4", "4", "3.9", "KiB"]  # the param's 2 placeholders too
    assert row(lines, "p")[1:7] == ["param", "8", "10", "2", "2", "-"]  # counted in b's row


def test_scaffold_row_is_marked_and_counts_its_joint_encoding():
    lines = table_lines()
    assert row(lines, "[both]") == ["[both]", "scaffold", "3", "11", "8", "0", "7", "6.8", "KiB"]
    assert any("[name]: a scaffold" in " ".join(line) for line in lines)


def test_rows_are_indented_under_their_union_and_scaffold():
    depth = {r.node.name: r.depth for r in table_rows(layout()) if r.node.kind != "text"}
    assert depth == {"both": 0, "a": 1, "a2": 2, "b": 1, "p": 2, "plan": 0, "city": 1, "paris": 2, "tokyo": 2}
    names = [r.node.name for r in table_rows(layout()) if r.node.kind != "text"]
    assert names == ["both", "a", "a2", "b", "p", "plan", "city", "paris", "tokyo"]  # containers first
    text = layout_table(layout())
    assert "\n  city " in text and "\n    paris " in text and "\n    tokyo " in text


def test_root_text_after_the_preamble_is_not_encoded():
    rows = [r for r in table_rows(layout()) if r.node.kind == "text" and r.node.parent is None]
    assert [(r.node.start, r.encoded) for r in rows] == [(0, 1), (1, 2), (6, 0), (15, 0)]


def test_totals_include_the_scaffold_joint_encoding():
    summary = layout_table(layout(), BPT).splitlines()
    # modules and preamble: 3 (BOS, Docs, :) + a 2 + a2 1 + b 4 + plan 1 + paris 3 + tokyo 1 = 15; scaffold 7
    assert summary[-2] == ("schema 's': 16 positions, 6 modules, 22 tokens encoded (15 by modules and the preamble, "
                           "7 by the joint encodings of 1 scaffold(s)), 21.5 KiB of state once all is encoded")


def test_table_without_bytes_or_scaffolds():
    tok = WordTokenizer()
    text = layout_table(build_layout(parse_schema('<schema name="t"><module name="m">Hello there</module></schema>'),
                                     tok, PLAIN_MARKUP))
    assert "state bytes" not in text and "[name]" not in text
    assert text.splitlines()[-1] == "schema 't': 3 positions, 1 modules, 3 tokens encoded"
