"""Factories for the PML tests: parse, lay out and plan PML text with the word-level fake tokenizer.

Every helper takes the tokenizer explicitly (or makes a fresh one), because WordTokenizer hands out
ids in order of first appearance: tests that compare ids must share one instance.
"""

from __future__ import annotations

import pytest

from pc_cpu.pml.layout import Layout, build_layout
from pc_cpu.pml.plan import Plan, build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.roles import PLAIN_MARKUP, RoleMarkup
from pc_cpu.pml.schema import parse_schema
from tests.fake_tokenizer import WordTokenizer

# A ChatML markup with visible suffixes, so role tokens show up in WordTokenizer output.
CHATML_MARKUP = RoleMarkup(
    prefix={"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
            "assistant": "<|im_start|>assistant\n"},
    suffix={"system": "<|im_end|>\n", "user": "<|im_end|>\n", "assistant": "<|im_end|>\n"},
    generation_prompt="<|im_start|>assistant\n",
    from_template=True,
)

# The schema of pc_cpu.pml.schema's docstring, without roles. With a BOS-adding WordTokenizer:
#   0 BOS | ROOT "Trips :" 1-3 | plan [3, 13): "Plan" 3, days 4-8 (len 4), "days in" 8-10,
#   union city [10, 13): paris "Paris is nice" 10-13, tokyo "Tokyo" 10-11 | ROOT "Bye" 13 | length 14
TRIP = """<schema name="trip">
  Trips:
  <module name="plan">Plan <param name="days" len="4"/> days in
    <union name="city">
      <module name="paris">Paris is nice</module>
      <module name="tokyo">Tokyo</module>
    </union>
  </module>
  Bye
</schema>"""


def utf8_refusal(what: str, at: int, code: str = "DC80") -> str:
    """Returns the regex of pc_cpu.pml.text.check_utf8's message for a lone surrogate U+`code` at character `at`."""
    return rf"^invalid Unicode: a lone surrogate \(U\+{code}\) at character {at} of {what}; send UTF-8 text$"


def words(tokenizer: WordTokenizer, ids) -> list[str]:
    """Returns the words of `ids`; BOS is "<bos>" and a param placeholder "<ph>"."""
    special = {1: "<bos>", 0: "<ph>"}
    return [special.get(i) or tokenizer.words[i] for i in ids]


def layout_of(pml: str, markup: RoleMarkup = PLAIN_MARKUP, *, tokenizer: WordTokenizer | None = None) -> Layout:
    """Returns the Layout of schema text `pml` (a fresh BOS-adding WordTokenizer unless given)."""
    return build_layout(parse_schema(pml), tokenizer or WordTokenizer(), markup)


def plan_of(schema: str, prompt: str, markup: RoleMarkup = PLAIN_MARKUP, *,
            tokenizer: WordTokenizer | None = None) -> Plan:
    """Returns the Plan of prompt text `prompt` against schema text `schema`."""
    tokenizer = tokenizer or WordTokenizer()
    layout = layout_of(schema, markup, tokenizer=tokenizer)
    return build_plan(layout, parse_prompt(prompt), tokenizer, markup)


@pytest.fixture
def tok() -> WordTokenizer:
    """A fresh word tokenizer that adds BOS (id 1); placeholders are id 0."""
    return WordTokenizer()
