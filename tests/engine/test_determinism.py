"""Same tokens, same answer: whichever tier served the modules, whatever else the library holds.

Attention sums a sequence's cells in KV-slot order, so these tests make the slot layouts
differ on purpose (other schemas resident, evictions, restores, a second process) and
require bit-identical logits or token-identical answers (pc_cpu.engine.cells.streams).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import batched_prefill_logits, smollm2_path

PASSAGES = [
    "The lighthouse keeper climbed the spiral stairs every evening at dusk and trimmed the wick.",
    "Harbour records list forty ships lost on the northern reef between 1820 and 1870.",
    "The town council voted in 1858 to build a second light on the point beyond the reef.",
    "Fishermen say the fog rolls in from the east on the first warm night of spring.",
    "The keeper's logbook mentions a storm on 20 January 1858 that broke the great lens.",
    "A ferry now crosses the bay twice a day, weather permitting, from the old stone pier.",
]
SCHEMA = ('<schema name="lib"><system>Answer from the passages.</system>'
          + "".join(f'<module name="p{i}">{text} </module>' for i, text in enumerate(PASSAGES)) + "</schema>")
OTHER = ('<schema name="other"><module name="x">' + "Unrelated filler about gardens and roses. " * 12
         + '</module><module name="y">More filler about trains and timetables.</module></schema>')
PROMPTS = [
    '<prompt schema="lib"><p0/><p2/><p4/><user>When did the storm break the lens?</user></prompt>',
    '<prompt schema="lib"><p1/><p3/><p5/><user>How often does the ferry cross?</user></prompt>',
    '<prompt schema="lib"><p2/><p3/><p4/><p5/><user>What did the council vote for?</user></prompt>',
]


def answers(cache, max_tokens: int = 12) -> tuple[list, list[set[str]]]:
    """Returns each prompt's greedy token ids and last prompt-token logits, and the tiers that served its modules."""
    results = [cache.generate(p, max_tokens=max_tokens) for p in PROMPTS]
    return [(r.token_ids, prompt_logits(cache, p).tobytes()) for r, p in zip(results, PROMPTS)], \
        [set(r.tiers.values()) for r in results]


def prompt_logits(cache, prompt: str, *, use_cache: bool = True) -> np.ndarray:
    """Returns the logits after the prompt's last token, its cells built as generate builds them."""
    with cache.workbench.prefilled(cache.plan(prompt), use_cache=use_cache) as prefilled:
        return prefilled.logits()


def check_every_tier_gives_the_same_answers(make_cache, model, tmp_path) -> None:
    store = tmp_path / "store"
    first = make_cache(model, store=store)
    first.load_schema(OTHER)  # other cells in the library, so the slots differ from run to run
    first.load_schema(SCHEMA, encode=False)
    fresh, tiers = answers(first)
    assert "encoded" in set().union(*tiers)
    resident, tiers = answers(first)
    assert set().union(*tiers) == {"context"}
    first.evict()
    from_ram, tiers = answers(first)  # later prompts find what earlier ones restored in the context
    assert tiers[0] == {"ram"} and "encoded" not in set().union(*tiers)

    second = make_cache(model, store=store)  # another process: nothing resident, nothing in RAM
    second.load_schema(SCHEMA, encode=False)
    from_disk, tiers = answers(second)
    assert tiers[0] == {"disk"} and "encoded" not in set().union(*tiers)

    assert all(len(ids) > 0 for ids, _ in fresh)
    assert resident == fresh
    assert from_ram == fresh
    assert from_disk == fresh


def test_every_tier_gives_the_same_answers_on_each_model(make_cache, tmp_path):
    check_every_tier_gives_the_same_answers(make_cache, None, tmp_path)


def test_a_prefix_module_is_exact_after_evictions_and_restores(make_cache):
    # The module right after the preamble is computed exactly as a full prefill computes it, in a
    # library whose slots were churned first: its cached logits equal the full prefill's, bit for bit.
    cache = make_cache()
    cache.load_schema(OTHER)
    cache.load_schema(SCHEMA)
    cache.evict("lib")
    cache.generate(PROMPTS[1], max_tokens=2)  # restores some modules into the holes
    prompt = '<prompt schema="lib"><p0/><user>Who climbed the stairs?</user></prompt>'
    plan = cache.plan(prompt)
    with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        cached = prefilled.logits()
    module = cache.schemas.layout("lib").modules["p0"]
    # A fresh context, in the batches the cache computed the tokens in (batched_prefill_logits says why).
    baseline = batched_prefill_logits(make_cache(), SCHEMA, prompt, [module.start, module.end])
    assert plan.cached_tokens > 0
    assert np.abs(cached - baseline).max() == 0.0


def test_the_full_prefill_equals_llama_cpp_python_whatever_is_resident(make_smollm2_cache):
    llama_cpp = pytest.importorskip("llama_cpp")
    from pc_cpu.engine.llama.extra_buffers import llama_peer
    path = smollm2_path()
    cache = make_smollm2_cache(flash_attn=False, n_ctx=2048)
    cache.load_schema(OTHER)
    cache.load_schema(SCHEMA)
    plan = cache.plan(PROMPTS[0])
    ours = cache.generate(PROMPTS[0], max_tokens=16, use_cache=False).token_ids
    our_logits = prompt_logits(cache, PROMPTS[0], use_cache=False)

    llama = llama_peer(path, n_ctx=2048, n_threads=2, n_threads_batch=2, flash_attn=False,
                            verbose=False)
    try:
        theirs = []
        for lo, hi in plan.calls:  # the calls the baseline makes (Plan.calls): the same batches, the same bits
            assert lo == llama.n_tokens  # none recomputes here: the prompt ends with its own text
            llama.eval(list(plan.tokens[lo:hi]))
        their_logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1),
                                             shape=(llama.n_vocab(),)).copy()
        for _ in range(16):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),))
            token = int(np.argmax(logits))
            if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llama.model), token):
                break
            theirs.append(token)
            llama.eval([token])
    finally:
        llama.close()
    assert len(ours) > 0
    assert ours == theirs
    assert np.abs(our_logits - their_logits).max() == 0.0


def test_full_prefill_of_a_prompts_tokens_is_the_uncached_prompt(make_cache):
    # The public baseline (PromptCache.full_prefill) computes where an uncached prompt is computed,
    # in an empty prompt stream: the same tokens in the same calls (Plan.calls) give the same logits,
    # bit for bit, whatever else the library holds.
    from pc_cpu.errors import PromptCacheError

    cache = make_cache()
    cache.load_schema(OTHER)
    cache.load_schema(SCHEMA)
    plan = cache.plan(PROMPTS[2])
    uncached = prompt_logits(cache, PROMPTS[2], use_cache=False)
    with cache.workbench.full_prefill(plan.tokens, batch_starts=[lo for lo, _ in plan.calls]) as prefilled:
        assert prefilled.end == len(plan.tokens)
        assert prefilled.positions() == list(range(len(plan.tokens)))
        assert prefilled.logits().tobytes() == uncached.tobytes()
    with pytest.raises(PromptCacheError, match="outside the"):
        cache.workbench.full_prefill(plan.tokens, batch_starts=[len(plan.tokens)])
    with pytest.raises(PromptCacheError, match="no tokens"):
        cache.workbench.full_prefill([])
