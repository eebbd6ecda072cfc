"""A compiled prompt program runs end to end: its schema loads on first use and its modules are cached."""

from __future__ import annotations

import pc_cpu


@pc_cpu.prompt_program(params={"city": 4})
def travel(city, long):
    "You help travellers. "
    f"The trip goes to {city}. "
    if long:
        "The traveller has two weeks and wants a detailed plan with museums, food and walks. "
    else:
        "The traveller has one weekend. "


def test_compiled_prompt_generates_with_its_schema_loaded_on_first_use(make_cache):
    cache = make_cache()
    prompt = travel(city="Paris", long=True).with_user("Plan it.")
    result = cache.generate(prompt, max_tokens=4)
    assert travel.name in cache.schema_names
    assert result.cached_tokens > 0 and len(result.token_ids) == 4
    assert any("long" in m or "else" not in m for m in result.modules)


def test_compiled_prompt_cached_equals_baseline_tokens_shape(make_cache):
    cache = make_cache()
    prompt = travel(city="Rome", long=False)
    cached = cache.generate(prompt, max_tokens=3)
    baseline = cache.generate(prompt, max_tokens=3, use_cache=False)
    assert cached.prompt_tokens == baseline.prompt_tokens
