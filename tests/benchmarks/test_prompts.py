"""Prompt building for the accuracy tasks: layouts, escaping, imports, KV chunks (no model)."""

import json

import pytest

from pc_cpu.benchmarks import prompts
from pc_cpu.benchmarks.evaldata import DocItem, KVItem, Passage
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.schema import parse_schema

ITEM = DocItem(7, "who wrote <it> & why?", ("Ann",), (Passage("T1", "one & two"), Passage("T2", "a <b> c")), 1)
KV = KVItem(3, (("k1", "v1"), ("k2", "v2"), ("k3", "v3")), "k2", "v2", 1)


def test_document_text_follows_lost_in_the_middle():
    assert prompts.document_text(2, Passage("T", "x")) == "Document [2](Title: T) x\n"


@pytest.mark.parametrize("layout", prompts.LAYOUTS)
def test_every_layout_parses_and_keeps_special_characters(layout):
    schema = prompts.qa_schema("s", ITEM, layout)
    parse_schema(schema)  # escaped well enough for the PML parser
    assert "one &amp; two" in schema and "a &lt;b&gt; c" in schema and "&#10;" in schema
    parse_prompt(prompts.qa_prompt("s", ITEM, layout))


def test_single_layout_is_one_module_and_modular_one_per_passage():
    assert prompts.qa_schema("s", ITEM, "single").count("<module ") == 1
    assert prompts.qa_schema("s", ITEM, "modular").count("<module ") == 2
    assert '<scaffold name="all">' in prompts.qa_schema("s", ITEM, "scaffold")
    assert "<docs/>" in prompts.qa_prompt("s", ITEM, "single")
    assert "<d0/><d1/>" in prompts.qa_prompt("s", ITEM, "modular")


def test_gap_modules_come_first_and_are_not_imported():
    schema = prompts.qa_schema("s", ITEM, "modular", gap=(Passage("G", "filler"),))
    assert schema.index('name="g0"') < schema.index('name="d0"')
    assert "<g0/>" not in prompts.qa_prompt("s", ITEM, "modular")


def test_unknown_layout_lists_the_choices():
    with pytest.raises(ValueError, match="single, modular, scaffold"):
        prompts.qa_schema("s", ITEM, "prefix")


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_kv_chunks_join_into_the_json_object(chunk):
    pieces = prompts.kv_chunks(KV, chunk)
    assert len(pieces) == -(-len(KV.pairs) // chunk)
    assert json.loads("".join(pieces)) == dict(KV.pairs)


def test_kv_prompt_imports_every_chunk_and_asks_the_key():
    prompt = prompts.kv_prompt("s", KV, "modular", chunk=2)
    assert "<d0/><d1/>" in prompt and "<d2/>" not in prompt and "k2" in prompt
    parse_schema(prompts.kv_schema("s", KV, "modular", chunk=2))


def test_plain_prompts_have_no_roles_and_still_parse():
    schema = prompts.qa_schema("s", ITEM, "modular", chat=False)
    prompt = prompts.qa_prompt("s", ITEM, "modular", chat=False)
    assert "<system>" not in schema and "<user>" not in prompt and "Question:" in prompt
    parse_schema(schema)
    parse_prompt(prompt)
    parse_schema(prompts.kv_schema("s", KV, "single", chunk=2, chat=False))
