"""Exact when it can be: a question whose exact prefix (preamble and documents computed together) is stored answers
as the full prefill does, token for token."""

from __future__ import annotations

import pytest

from pc_cpu.engine.prompts.document_cells import DocumentEncoder
from pc_cpu.errors import DocumentError
from pc_cpu.store.document_library import PREFIX_LABEL
from tests.engine.test_documents import FUJI, NILE, PARIS, QUESTION
from tests.engine.test_documents import prefix_key as stored_prefix_key
from tests.engine.test_stream_reuse import count_calls

OTHER = "Which river flows north?"


@pytest.fixture
def cache(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    cache.ids = [cache.add_document(text) for text in (FUJI, NILE, PARIS)]
    return cache


def ask(cache, question, docs=None, **options):
    return cache.ask(question, documents=cache.ids if docs is None else docs, max_tokens=8, **options)


def baseline(cache, question, docs=None):
    return ask(cache, question, docs, use_cache=False)


def prefix_key(cache, question, docs=None):
    prompt = cache.documents.prompt(question, [cache.documents.library.get(d).text for d in docs or cache.ids])
    return stored_prefix_key(cache, prompt), prompt


def prefixes(cache) -> list:
    """Returns the exact prefixes any tier holds."""
    return [key for tier in cache.store.tiers for key in tier.keys() if key.label.startswith(PREFIX_LABEL)]


def test_first_computes_the_exact_prefix_and_every_question_then_answers_as_the_baseline(cache):
    key, prompt = prefix_key(cache, QUESTION)
    first = ask(cache, QUESTION, prefix="first")
    assert first.token_ids == baseline(cache, QUESTION).token_ids
    assert (first.cached_tokens, first.uncached_tokens) == (0, len(prompt.tokens))
    assert set(first.tiers.values()) == {"encoded"} and cache.store.contains(key)

    second = ask(cache, OTHER, prefix="first")  # the slot still holds the prefix: only the question is computed
    _, other = prefix_key(cache, OTHER)
    assert second.token_ids == baseline(cache, OTHER).token_ids
    assert (second.cached_tokens, second.uncached_tokens) == (other.tail_start, len(other.tail))
    assert set(second.tiers.values()) == {"context"} and set(second.tiers) == {"#preamble", *cache.ids}

    cache.evict()  # the held streams go: the prefix is restored from RAM
    third = ask(cache, OTHER, prefix="first")
    assert set(third.tiers.values()) == {"ram"} and third.token_ids == second.token_ids


def test_background_answers_apart_then_computes_the_exact_prefix_when_idle(cache, monkeypatch):
    apart = count_calls(monkeypatch, DocumentEncoder, "prefill")  # documents encoded apart, moved into place
    key, _ = prefix_key(cache, QUESTION)
    first = ask(cache, QUESTION)  # "background" is the default
    assert apart == ["prefill"] and set(first.tiers.values()) == {"ram"}
    assert cache.wait_idle(timeout=60) and cache.store.contains(key)
    second = ask(cache, OTHER)
    assert second.token_ids == baseline(cache, OTHER).token_ids
    assert set(second.tiers.values()) == {"context"} and apart == ["prefill"]  # the stream the idle work left

    # Another order is another prefix: answered apart (and its own prefix computed afterwards).
    reordered = cache.ids[::-1]
    other_key, _ = prefix_key(cache, OTHER, reordered)
    assert not cache.store.contains(other_key)
    ask(cache, OTHER, reordered)
    assert apart == ["prefill"] * 2
    assert cache.wait_idle(timeout=60) and cache.store.contains(other_key)
    again = ask(cache, OTHER, reordered)
    assert apart == ["prefill"] * 2 and again.token_ids == baseline(cache, OTHER, reordered).token_ids


def test_a_prefix_a_slot_kept_after_the_tiers_lost_it_is_stored_again_for_the_next_question(cache):
    key, _ = prefix_key(cache, QUESTION)
    ask(cache, QUESTION, prefix="first")
    for tier in cache.store.tiers:  # evicted, as a full RAM or disk budget would
        tier.remove(key)
    held = ask(cache, QUESTION, prefix="first")
    assert set(held.tiers.values()) == {"context"} and cache.store.contains(key)
    again = ask(cache, OTHER, prefix="background")  # looks in the tiers: finds it, and the slot still holds it
    assert set(again.tiers.values()) == {"context"} and again.token_ids == baseline(cache, OTHER).token_ids


def test_off_and_the_baseline_never_write_a_prefix(cache):
    for options in ({"prefix": "off"}, {"prefix": "off", "recompute": "all"}, {"use_cache": False},
                    {"use_cache": False, "prefix": "first"}):
        ask(cache, QUESTION, **options)
        ask(cache, OTHER, **options)
        assert cache.wait_idle(timeout=60) and prefixes(cache) == [], options


def test_off_never_reads_a_stored_prefix(cache):
    ask(cache, QUESTION, prefix="first")
    off = ask(cache, OTHER, prefix="off")
    assert set(off.tiers.values()) == {"ram"} and off.token_ids == ask(cache, OTHER, prefix="off").token_ids


def test_removing_a_document_removes_the_prefixes_holding_it(cache):
    ask(cache, QUESTION, prefix="first")
    ask(cache, QUESTION, cache.ids[:2], prefix="first")
    assert len(prefixes(cache)) == 4  # RAM and disk
    cache.remove_document(cache.ids[2])
    assert [key.label for key in prefixes(cache)] == [f"{PREFIX_LABEL} {cache.ids[0]} {cache.ids[1]}"] * 2


def test_an_invalid_prefix_is_refused_naming_the_valid_ones_before_any_work(cache):
    steps = cache.workbench.scheduler.stats.steps
    for use_cache in (True, False):
        with pytest.raises(DocumentError, match="prefix='always' is not a prefix policy; use one of background, "
                                                "first, off"):
            ask(cache, QUESTION, prefix="always", use_cache=use_cache)
    assert cache.workbench.scheduler.stats.steps == steps


def test_a_question_arriving_while_the_prefix_is_computed_goes_first_and_the_prefix_is_computed_after(cache):
    scheduler = cache.workbench.scheduler
    prompts = scheduler.prompts  # the prompt context, where the scheduler computes the prefix and the question
    prompts.n_batch = 16  # the prefix in several chunks (every path chunks alike)
    arrived, stopped, idle_chunks = [], [], []
    decode, stop = prompts.decode, scheduler._stop_idle_run

    def decode_spy(tokens, positions, seq, **kwargs):
        if scheduler._idle_run is not None and not arrived:  # a chunk of the idle task: its 2nd brings the question
            idle_chunks.append(positions[-1] + 1)
            if len(idle_chunks) == 2:  # asked from the scheduler's thread, which holds the (reentrant) context lock
                arrived.append(cache.stream_ask(OTHER, documents=cache.ids, max_tokens=8))
        return decode(tokens, positions, seq, **kwargs)

    def stop_spy():
        if scheduler._idle_run is not None:
            stopped.append(scheduler._idle_run.done)
        stop()

    prompts.decode, scheduler._stop_idle_run = decode_spy, stop_spy
    ask(cache, QUESTION)
    assert cache.wait_idle(timeout=60)
    for _ in arrived[0]:
        pass
    key, _ = prefix_key(cache, OTHER)
    # Given way after the chunk that ran, computed again later.
    assert stopped == [idle_chunks[1]] and cache.store.contains(key)
    assert arrived[0].result.token_ids == ask(cache, OTHER, prefix="off").token_ids  # answered apart
    assert ask(cache, OTHER).token_ids == baseline(cache, OTHER).token_ids


def test_a_question_sent_right_after_an_answer_goes_before_that_answers_prefix(cache, monkeypatch):
    # The prefix waits PREFIX_DELAY_S after its answer: a script's next question goes first instead
    # of waiting for the chunk in flight (bench/back_to_back.py). Long here, whatever the machine's speed.
    from pc_cpu.engine.prompts import document_prompt

    monkeypatch.setattr(document_prompt, "PREFIX_DELAY_S", 600.0)
    ask(cache, QUESTION)
    key, _ = prefix_key(cache, QUESTION)
    prompts = cache.workbench.scheduler.prompts  # the prompt context, where the question's tail is computed
    starts, decode = [], prompts.decode
    monkeypatch.setattr(prompts, "decode", lambda tokens, positions, seq, **kw: (
        starts.append(positions[0]), decode(tokens, positions, seq, **kw))[1])
    assert not cache.wait_idle(timeout=0.5) and not cache.store.contains(key)  # waiting for its delay
    assert ask(cache, OTHER).token_ids  # the same documents: every encoding there, nothing to compute but the tail
    assert starts and 0 not in starts  # the question's own tokens only: no chunk of the prefix went first
    assert not cache.store.contains(key)
