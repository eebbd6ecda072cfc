"""Short checks on each installed packaged model: sensible answers from cached modules, exact where the math says so."""

from __future__ import annotations

from pc_cpu.demo import QUESTIONS, demo_prompt, demo_schema


def test_cached_demo_answers_come_from_the_documents(packaged_cache):
    packaged_cache.load_schema(demo_schema())
    doc, question = QUESTIONS[1]  # the Calder Light: automated in 1987
    cached = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24)
    baseline = packaged_cache.generate(demo_prompt(doc, question), max_tokens=24, use_cache=False)
    assert "1987" in cached.text and "1987" in baseline.text
    assert cached.cached_tokens > 250 and cached.uncached_tokens < 40


def test_each_union_member_answers_its_own_question(packaged_cache):
    packaged_cache.load_schema(demo_schema())
    expected = {"observatory": "41,000", "railway": "212"}
    for doc, question in QUESTIONS:
        if doc in expected:
            answer = packaged_cache.generate(demo_prompt(doc, question), max_tokens=32).text
            assert expected[doc] in answer, (doc, answer)


def test_module_right_after_the_system_message_matches_the_baseline_tokens(packaged_cache):
    schema = ('<schema name="exact"><system>You are a helpful assistant.</system><user><module name="doc">'
              'The capital of the fictional country of Norland is Vesterhavn, a port city of 80,000 people.'
              '</module></user></schema>')
    packaged_cache.load_schema(schema)
    prompt = '<prompt schema="exact"><doc/><user>What is the capital of Norland?</user></prompt>'
    cached = packaged_cache.generate(prompt, max_tokens=16)
    baseline = packaged_cache.generate(prompt, max_tokens=16, use_cache=False)
    assert cached.token_ids == baseline.token_ids
    assert "Vesterhavn" in cached.text
