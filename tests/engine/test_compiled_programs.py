"""A compiled prompt program runs end to end: its schema loads on first use, it imports the modules
its arguments pick, and where the math says so its cached answer is the full prefill's."""

from __future__ import annotations

import numpy as np
import pytest

import pc_cpu
from tests.conftest import batched_prefill_logits, prefill_logits


@pc_cpu.prompt_program(params={"city": 4})
def travel(city, long):
    """A param module, then an if/else union."""
    f"The trip goes to {city}. "
    if long:
        "The traveller has two weeks and wants a detailed plan with museums, food and walks. "
    else:
        "The traveller has one weekend. "


@pc_cpu.prompt_program
def guide(long):
    """Schema text, then an if/else union right after it.

    Both members are computed after the same text as in a full prefill, so their cells are exact.
    """
    "You help travellers plan their trips. "
    if long:
        "The traveller has two weeks and wants a detailed plan with museums, food and walks. "
    else:
        "The traveller has one weekend. "


@pytest.mark.tiny_only  # the token counts below are those of SmolLM2's tokenizer (the tiny model's)
def test_compiled_prompt_loads_its_schema_on_first_use_and_imports_what_its_arguments_pick(make_cache):
    cache = make_cache()
    assert travel.name not in cache.schemas.names
    long = cache.generate(travel(city="Paris", long=True).with_user("Plan it."), max_tokens=4)
    assert travel.name in cache.schemas.names
    assert long.modules == ["travel-city", "travel-long"] and len(long.token_ids) == 4
    encoded = cache.schemas.encoded
    short = cache.generate(travel(city="Rome", long=False), max_tokens=4)
    assert short.modules == ["travel-city", "travel-long-else"]  # the else branch: the union's other member
    assert set(short.tiers.values()) == {"context"} and cache.schemas.encoded == encoded  # loaded once
    layout = cache.schemas.layout(travel.name)
    assert layout.modules["travel-long"].start == layout.modules["travel-long-else"].start
    # Cached: both modules but the 4-token param slot and the last token, decoded for its logits,
    # plus the BOS token of the preamble on models that add one (Gemma 3).
    city, weekend = layout.modules["travel-city"].n_tokens, layout.modules["travel-long-else"].n_tokens
    bos = 0 if cache.model.bos_id is None else 1
    assert short.cached_tokens == bos + city - 4 + weekend - 1
    assert short.uncached_tokens == 2  # "Rome" (one token) and that last token


@pytest.mark.parametrize("long", [True, False])
def test_compiled_union_member_after_the_schema_text_gives_the_full_prefill_logits(make_cache, long):
    prompt = guide(long=long).with_user("Plan it.")
    cache = make_cache()
    cached = prefill_logits(cache, guide.schema_pml, prompt, use_cache=True)
    member = cache.schemas.layout(guide.name).modules[cache.plan(prompt).modules[-1]]
    # A fresh context, in the batches the cache computed the tokens in (batched_prefill_logits says why).
    baseline = batched_prefill_logits(make_cache(), guide.schema_pml, prompt, [member.start, member.end])
    assert np.abs(cached - baseline).max() == 0.0


def test_compiled_prompt_gives_the_greedy_tokens_of_a_fresh_full_prefill(make_cache):
    prompt = guide(long=True).with_user("Plan it.")
    cache = make_cache()
    cached = cache.generate(prompt, max_tokens=12)
    fresh = make_cache()
    fresh.load_schema(guide.schema_pml, encode=False)
    baseline = fresh.generate(prompt, max_tokens=12, use_cache=False)
    assert cached.cached_tokens > 0 and baseline.cached_tokens == 0
    assert cached.token_ids == baseline.token_ids and len(cached.token_ids) == 12
