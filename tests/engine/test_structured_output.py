"""Answers held to JSON by a grammar (response_format), and repetition penalties: same tokens, same answer, from any tier.

The tiny model's weights are random, so what it writes means nothing; a grammar still holds every
token it may draw, so an answer that ends (not cut at max_tokens) parses and is one the schema admits.
"""

from __future__ import annotations

import json

import pytest

from pc_cpu.engine.llama.grammar import response_grammar, schema_grammar
from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.errors import PromptCacheError

COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "n": {"type": "integer"}},
          "required": ["colour", "n"]}
AS_COLOUR = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR}}
MESSAGES = [{"role": "user", "content": "Pick a colour and a number."}]
SCHEMA = ('<schema name="s"><system>Answer in JSON.</system><module name="doc">Boats are red or green and '
          'number about a dozen in the harbour.</module><user></user></schema>')
PROMPT = '<prompt schema="s"><doc/><user>Which colour, and how many?</user></prompt>'


@pytest.mark.parametrize("response_format, fragment", [
    ("json", "must be an object"),
    ({"type": "xml"}, "response_format.type='xml': use one of text, json_object, json_schema"),
    ({"type": "json_schema"}, 'must be an object with a "schema"'),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "Unrecognized schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}, "cannot constrain"),
    ({"type": "json_schema", "json_schema": {"schema": [1, 2]}}, "must be an object, not list"),
])
def test_a_response_format_that_cannot_constrain_an_answer_is_refused_naming_why(response_format, fragment):
    with pytest.raises(PromptCacheError) as refused:
        response_grammar(response_format)
    assert fragment in str(refused.value)


def test_free_text_has_no_grammar_and_json_object_is_any_object():
    assert response_grammar(None) is None and response_grammar({"type": "text"}) is None
    assert response_grammar({"type": "json_object"}) == schema_grammar({"type": "object"})


@pytest.mark.parametrize("options, name", [({"min_p": 1.5}, "min_p"), ({"repeat_penalty": 0}, "repeat_penalty"),
                                           ({"frequency_penalty": 3}, "frequency_penalty"),
                                           ({"presence_penalty": float("nan")}, "presence_penalty"),
                                           ({"penalty_last_n": -1}, "penalty_last_n"), ({"grammar": " "}, "grammar")])
def test_a_sampling_option_out_of_range_is_refused_by_name(options, name):
    with pytest.raises(PromptCacheError, match=name):
        SamplingParams(**options).validate()


@pytest.mark.tiny_only
def test_a_chat_answer_held_to_a_schema_parses_and_is_the_full_prefills(make_cache):
    cache = make_cache(store=False)
    cached = cache.chat(MESSAGES, max_tokens=48, response_format=AS_COLOUR)
    again = cache.chat(MESSAGES, max_tokens=48, response_format=AS_COLOUR)  # the turn's cells, reused
    baseline = cache.chat(MESSAGES, max_tokens=48, response_format=AS_COLOUR, use_cache=False)
    assert cached.finish_reason == "stop"
    answer = json.loads(cached.text)
    assert answer["colour"] in ("red", "green") and isinstance(answer["n"], int) and set(answer) == {"colour", "n"}
    assert cached.token_ids == again.token_ids == baseline.token_ids


def test_a_schema_prompt_with_a_grammar_and_penalties_answers_the_same_from_every_tier(make_cache, tmp_path):
    options = {"max_tokens": 24, "response_format": AS_COLOUR, "repeat_penalty": 1.3, "frequency_penalty": 0.4,
               "presence_penalty": 0.2}
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(SCHEMA)
    resident = cache.generate(PROMPT, **options)
    cache.evict()
    from_ram = cache.generate(PROMPT, **options)
    baseline = cache.generate(PROMPT, use_cache=False, **options)
    assert set(from_ram.tiers.values()) == {"ram"}
    assert resident.token_ids == from_ram.token_ids == baseline.token_ids
    assert resident.text.startswith("{")  # held to the grammar from its first token


@pytest.mark.tiny_only  # the random model repeats itself within 32 tokens; a real one may not
def test_penalties_change_a_greedy_answer_and_it_stays_the_full_prefills(make_cache):
    cache = make_cache(store=False)
    plain = cache.chat(MESSAGES, max_tokens=32)
    penalized = cache.chat(MESSAGES, max_tokens=32, repeat_penalty=2.0, frequency_penalty=2.0)
    baseline = cache.chat(MESSAGES, max_tokens=32, repeat_penalty=2.0, frequency_penalty=2.0, use_cache=False)
    assert len(plain.token_ids) - len(set(plain.token_ids)) > len(penalized.token_ids) - len(set(penalized.token_ids))
    assert penalized.token_ids == baseline.token_ids


@pytest.mark.tiny_only
def test_a_schema_llama_cpp_cannot_parse_is_the_callers_error_before_the_prompt_runs(make_cache):
    cache = make_cache(store=False)
    with pytest.raises(PromptCacheError, match="Unrecognized schema"):
        cache.stream_chat(MESSAGES, response_format={"type": "json_schema",
                                                     "json_schema": {"schema": {"type": "nonsense"}}})


def test_logprobs_are_the_full_prefills_and_a_logit_bias_bans_a_token(make_cache):
    cache = make_cache(store=False)
    cached = cache.chat(MESSAGES, max_tokens=6, logprobs=2)
    baseline = cache.chat(MESSAGES, max_tokens=6, logprobs=2, use_cache=False)
    assert cached.logprobs == baseline.logprobs and len(cached.logprobs) == len(cached.token_ids)
    for token, entry in zip(cached.token_ids, cached.logprobs):
        assert entry["token_id"] == token == entry["top"][0]["token_id"]  # greedy: the likeliest
        assert entry["logprob"] <= 0 and len(entry["top"]) == 2
    banned = cache.chat(MESSAGES, max_tokens=1, logit_bias={cached.token_ids[0]: float("-inf")})
    assert banned.token_ids[0] != cached.token_ids[0]
    assert cache.chat(MESSAGES, max_tokens=1).logprobs is None


@pytest.mark.parametrize("logit_bias, fragment", [({"x": 1}, "keys are token ids"), ({10**9: -1}, "beyond this model")])
def test_a_logit_bias_that_names_no_token_is_refused(make_cache, logit_bias, fragment):
    cache = make_cache(store=False)
    with pytest.raises(PromptCacheError, match=fragment):
        cache.chat(MESSAGES, max_tokens=1, logit_bias=logit_bias)


def test_a_greedy_grammar_answer_is_the_same_when_the_grammar_masks_every_token(make_cache, monkeypatch):
    # The sampler draws first and applies the grammar only to a token it refuses (llama.cpp's way, for
    # speed); greedy, that must be the very answer of the grammar applied to every token's logits.
    from pc_cpu.engine.llama.sampler import Sampler

    cache = make_cache(store=False)
    options = {"max_tokens": 40, "response_format": AS_COLOUR}
    drawn_first = cache.chat(MESSAGES, **options)
    monkeypatch.setattr(Sampler, "_grammar_takes", lambda self, token: False)
    masked_always = cache.chat(MESSAGES, use_cache=False, **options)
    assert drawn_first.token_ids == masked_always.token_ids


def test_a_json_grammar_admits_no_raw_control_character_in_a_string():
    # Found by bench/extraction.py: an answer held to the converter's grammar had a raw newline inside a
    # string ("...this\n "), which JSON forbids, so it did not parse. llama.cpp's converter excludes them.
    grammar = schema_grammar({"type": "object", "properties": {"a": {"type": "string"}}})
    (char,) = [line for line in grammar.splitlines() if line.startswith("char ::=")]
    assert char.startswith('char ::= [^"\\\\\\x7F\\x00-\\x1F]')
