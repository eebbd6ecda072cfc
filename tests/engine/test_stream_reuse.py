"""A prompt whose restored cells a free slot's stream still holds computes only its own tail, with the same answer."""

from __future__ import annotations

from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt

SCHEMA = ('<schema name="lib"><system>Answer from the notes.</system><user>'
          '<module name="a">The red key opens the garden shed behind the house.</module>'
          '<module name="b">The blue key opens the attic above the kitchen.</module></user></schema>')


def prompt(question: str) -> str:
    return f'<prompt schema="lib"><a/><b/><user>{question}</user></prompt>'


def count_calls(monkeypatch, cls, name):
    calls = []
    original = getattr(cls, name)

    def spy(self, *args, **kwargs):
        calls.append(name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, spy)
    return calls


def test_the_same_modules_again_reuse_the_stream_and_answer_as_a_fresh_cache(make_cache, monkeypatch):
    tails = count_calls(monkeypatch, SchemaPrompt, "prefill_tail")
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA)
    cache.generate(prompt("Which key opens the shed?"), max_tokens=8)
    second = cache.generate(prompt("Which key opens the attic?"), max_tokens=12)
    assert tails == ["prefill_tail"] and set(second.tiers.values()) == {"context"}
    fresh = make_cache(store=False)
    fresh.load_schema(SCHEMA)
    alone = fresh.generate(prompt("Which key opens the attic?"), max_tokens=12)
    assert second.token_ids == alone.token_ids
    # Other modules, or the baseline: restored or computed afresh, never reused.
    cache.generate(f'<prompt schema="lib"><b/><user>Which key?</user></prompt>', max_tokens=2)
    cache.generate(prompt("Which key opens the attic?"), max_tokens=2, use_cache=False)
    assert tails == ["prefill_tail"]


def test_a_select_prompt_neither_reuses_a_held_stream_nor_leaves_one(make_cache, monkeypatch):
    # Its cells are the modules' with the chosen tokens computed again: not what the keys say. It
    # reused the stream of the same prompt without recompute, so select: recomputed nothing (Qwen
    # NQ 5: the same answers as policy 0 on 131 of 131 questions, at a higher speedup).
    tails = count_calls(monkeypatch, SchemaPrompt, "prefill_tail")
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA)
    question = prompt("Which key opens the shed?")
    cache.generate(question, max_tokens=2, recompute="select:50%")
    cache.generate(question, max_tokens=2)  # nothing held to reuse: it restores
    assert tails == []
    cache.workbench.blender.last_selected = ()
    cache.generate(question, max_tokens=2, recompute="select:50%")  # the stream just held is not reused
    assert tails == [] and len(cache.workbench.blender.last_selected) > 0


def test_a_cancelled_prompt_leaves_nothing_to_reuse(make_cache, monkeypatch):
    tails = count_calls(monkeypatch, SchemaPrompt, "prefill_tail")
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA)
    stream = cache.stream(prompt("Which key opens the shed?"), max_tokens=50)
    next(iter(stream), None)
    stream.close()
    cache.generate(prompt("Which key opens the shed?"), max_tokens=2)
    assert tails == []


def test_the_same_documents_again_reuse_the_stream(make_cache, monkeypatch, tmp_path):
    tails = count_calls(monkeypatch, DocumentWork, "prefill_tail")
    cache = make_cache(store=tmp_path / "store")
    if cache.model.info.n_swa:
        return  # documents need relocation (tests/engine/test_documents.py)
    ids = [cache.add_document("The red key opens the shed."), cache.add_document("The blue key opens the attic.")]
    # prefix="off": the documents encoded apart, as held (tests/engine/test_document_prefix.py holds the exact prefix)
    cache.ask("Which key opens the shed?", documents=ids, max_tokens=4, prefix="off")
    second = cache.ask("Which key opens the attic?", documents=ids, max_tokens=10, prefix="off")
    fresh = make_cache(store=tmp_path / "store")
    alone = fresh.ask("Which key opens the attic?", documents=ids, max_tokens=10, prefix="off")
    assert tails == ["prefill_tail"] and second.token_ids == alone.token_ids


def test_state_read_into_the_reused_buffer_is_the_state(engine):
    # move_to_stream reads a prompt's state into a buffer the context keeps; the bytes must be
    # exactly state_get's, followed by the zeroed room asked for, call after call.
    ctx = engine.ctx  # the library context
    tokens = engine.model.tokenize("One two three four five six seven. " * 8, special=False)
    ctx.decode(tokens, range(len(tokens)), 0, logits_last=False)
    short = engine.model.tokenize("Eight nine.", special=False)
    ctx.decode(short, range(len(short)), 1, logits_last=False)
    try:
        for seq, room in ((0, 0), (1, 50), (0, 12)):  # long; shorter, its room over stale bytes; long again
            view = ctx.state_get_reusing(seq, room_after=room)
            try:
                assert bytes(view) == ctx.state_get(seq) + bytes(room)
            finally:
                view.release()
    finally:
        ctx.seq_rm(0)
        ctx.seq_rm(1)
