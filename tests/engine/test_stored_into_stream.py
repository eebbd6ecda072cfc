"""A prompt whose encodings are all stored, none resident, is restored straight into its stream.

The same cells in the same order as the library's way (restore into the library, assemble,
read out, sort, restore into the stream), so the same answer whichever way served it; the
library gets the encodings back in idle time, unless the caller evicted them meanwhile.
"""

from __future__ import annotations

import pytest

from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt
from pc_cpu.engine.runtime.prompt_work import Answer

DOCS = {name: f"Document {name}: " + " ".join(f"{name}{i} fact number {i}." for i in range(12)) for name in "abc"}
SCHEMA = ('<schema name="t">Read this. <union name="doc">'
          + "".join(f'<module name="{n}">{t}</module>' for n, t in DOCS.items()) + "</union>"
          '<module name="note">Note: <param name="who" len="4"/> asked.</module></schema>')


def prompt(name: str, question: str = "What number comes after eleven?") -> str:
    return f'<prompt schema="t"><{name}/> {question}</prompt>'


def stream_after_prefill(cache, text: str) -> tuple[bytes, SchemaPrompt]:
    """Returns the state of the prompt stream that `text` is prefilled into (slot 0), and its SchemaPrompt."""
    plan = cache.plan(text)
    layout = cache.schemas.layout(plan.schema)
    with cache._lock:
        cache._scheduler.drop_held()
        work = SchemaPrompt(plan, layout, True, cache._prompts, cache._modules, cache._blender.get)
        work.prepare()
        work.prefill(0)
        try:
            return bytes(cache._prompts.state_get(0)), work
        finally:
            cache._prompts.seq_rm(0)


def test_a_stored_prompt_fills_its_stream_with_the_bytes_the_library_gives(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(SCHEMA)
    through_library, resident = stream_after_prefill(cache, prompt("b"))
    assert resident._stored is None and not resident._restored  # resident: assembled in the library
    cache.evict()
    straight, stored = stream_after_prefill(cache, prompt("b"))
    assert straight == through_library
    if cache.model.info.n_swa:  # a sliding window's second KV cache: restored through the library
        assert not stored._restored
        return
    assert stored._restored == {"#root", "b"}  # restored past the library
    assert cache.schemas.resident_cells == 0  # the library is not touched until idle time


def test_every_tier_answers_alike_when_the_stream_is_restored_straight(make_cache, tmp_path):
    store = tmp_path / "store"
    cache = make_cache(store=store)
    cache.load_schema(SCHEMA)
    resident = cache.generate(prompt("a"), max_tokens=8)
    cache.evict()
    from_ram = cache.generate(prompt("a"), max_tokens=8)
    other = make_cache(store=store)
    other.load_schema(SCHEMA, encode=False)
    from_disk = other.generate(prompt("a"), max_tokens=8)
    assert (resident.tiers, from_ram.tiers, from_disk.tiers) == (
        {"#root": "context", "a": "context"}, {"#root": "ram", "a": "ram"}, {"#root": "disk", "a": "disk"})
    assert resident.token_ids == from_ram.token_ids == from_disk.token_ids
    assert resident.token_ids == cache.generate(prompt("a"), max_tokens=8, use_cache=False).token_ids


def test_the_library_gets_the_encodings_back_once_idle_and_keeps_the_held_stream(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store", parallel=1)  # one slot: the restore must not take its stream
    cache.load_schema(SCHEMA)
    cache.evict()
    assert cache.generate(prompt("c"), max_tokens=2).tiers == {"#root": "ram", "c": "ram"}
    assert cache.wait_idle(timeout=60)
    assert cache.schemas.resident_cells > 0
    assert cache.stats().queues.held_streams == 1
    assert cache.generate(prompt("c", "Which is the first fact?"), max_tokens=2).tiers == {
        "#root": "context", "c": "context"}


def skip_a_sliding_window(cache) -> None:
    if cache.model.info.n_swa:
        pytest.skip("a sliding window's second KV cache is restored through the library")


def queued_restore(cache):
    """Returns the idle task a prompt restored straight from the store leaves (the library refilled later)."""
    skip_a_sliding_window(cache)
    cache.load_schema(SCHEMA)
    cache.evict()
    _, work = stream_after_prefill(cache, prompt("a"))
    task = work.idle_task(Answer((), 0, "", "stop"))
    assert task is not None and not task.tokens and not task.skip()
    return task


def test_an_eviction_before_idle_time_cancels_the_restore(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    task = queued_restore(cache)
    cache.evict()  # the caller wants the cells free: the queued restore must not undo that
    assert task.skip()


def test_an_idle_restore_makes_them_resident_and_is_then_skipped(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    task = queued_restore(cache)
    with cache._lock:
        task.save(None)
    assert cache._modules.sequence_of(cache.schemas.layout("t"), "a") is not None
    assert task.skip()


def make_root_resident(cache) -> None:
    cache.workbench.prepare(cache.plan('<prompt schema="t"><note who="Ann"/> Who asked?</prompt>'), use_cache=True)


@pytest.mark.parametrize("text, before", [
    ('<prompt schema="t"><note who="Ann"/> Who asked?</prompt>', None),  # an argument computed between the cells
    (prompt("a"), make_root_resident),  # one encoding resident, one stored
], ids=["argument", "resident-and-stored"])
def test_prompts_the_library_must_assemble_still_restore_through_it(make_cache, tmp_path, text, before):
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(SCHEMA)
    expected = cache.generate(text, max_tokens=6).token_ids  # every encoding resident
    cache.evict()
    if before is not None:
        before(cache)
    _, work = stream_after_prefill(cache, text)
    assert work._stored is None and not work._restored
    assert set(work.prepare().values()) <= {"context"}
    assert cache.generate(text, max_tokens=6).token_ids == expected
