"""PromptCache.stats and .memory: what a cache holds now, and where its memory goes (tiny model)."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError

SCHEMA = '<schema name="s"><module name="doc">A note about boats, harbours and the sea.</module></schema>'


def test_stats_count_what_the_cache_holds(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store", ram_bytes=64 << 20)
    empty = cache.stats()
    assert [t.name for t in empty.tiers] == ["ram", "disk"] and all(t.entries == 0 for t in empty.tiers)
    assert (empty.schemas, empty.documents, empty.conversation_tips, empty.resident_cells) == (0, 0, 0, 0)
    assert empty.tiers[0].budget_bytes == 64 << 20 and empty.library_cells == cache.n_ctx

    cache.load_schema(SCHEMA)
    cache.add_document("The ferry to Skerra leaves twice a day.", name="ferry")
    messages = [{"role": "user", "content": "Name a harbour."}]
    answer = cache.chat(messages, max_tokens=4)
    cache.chat(messages + [{"role": "assistant", "content": answer.text}, {"role": "user", "content": "Why?"}],
               max_tokens=4)
    assert cache.wait_idle(timeout=120)  # the repairs store the conversation's tips
    full = cache.stats()
    assert (full.schemas, full.documents) == (1, 1) and full.resident_cells > 0 and full.conversation_tips >= 1
    ram, disk = full.tiers
    assert 0 < ram.bytes_used <= ram.budget_bytes and ram.entries > 0 and disk.entries >= ram.entries
    assert full.queues.active == full.queues.waiting == 0
    assert full.to_dict()["tiers"]["disk"]["entries"] == disk.entries


def test_a_prompt_being_prefilled_counts_as_active_not_also_as_waiting(make_cache, monkeypatch):
    from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt

    cache = make_cache()
    cache.load_schema(SCHEMA)
    seen, prefill = [], SchemaPrompt.prefill

    def watched(work, slot):
        seen.append(cache.workbench.scheduler.queue_stats())
        return prefill(work, slot)

    monkeypatch.setattr(SchemaPrompt, "prefill", watched)
    cache.generate('<prompt schema="s"><doc/> Go on:</prompt>', max_tokens=2)
    assert [(q.active, q.waiting) for q in seen] == [(1, 0)]


def test_memory_gives_llama_cpps_buffers_and_the_bound_they_stay_under(make_cache):
    one, two = make_cache(parallel=1, store=False), make_cache(parallel=2, store=False)
    a, b = one.memory(), two.memory()
    assert a.streams == 1 + 1 + 2 and b.streams == a.streams + 1  # library, then a stream per slot, workspace, adder
    assert b.kv - a.kv == a.kv_cell * one.n_ctx  # one more slot: one more stream of n_ctx cells
    assert a.kv == a.kv_cell * one.n_ctx * a.streams and a.compute > 0
    assert a.weights == one.model.path.stat().st_size and a.ram_tier == 1 << 30
    assert a.bound == a.weights + a.kv + a.compute + a.state_buffers + a.ram_tier


def test_a_ram_tier_of_zero_bytes_keeps_none_and_needs_the_disk(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store", ram_bytes=0)
    assert [t.name for t in cache.store.tiers] == ["disk"] and cache.memory().ram_tier == 0
    with pytest.raises(PromptCacheError, match="ram_bytes=0 with store=False leaves nowhere"):
        make_cache(store=False, ram_bytes=0)
