"""One-pass recompute of a document prompt (pc_cpu.engine.recompute.recompute_pass): every run in one decode, in the library.

Each run must be computed after the cached cells before it (not after other runs' new cells),
whatever the sequence budget; the rest of the prompt keeps the bytes of its moved encodings;
every borrowed sequence ends empty, on success and on failure; one run, no idle sequence or no
room in the library take the prompt's own stream, as before.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from pc_cpu.engine.recompute import recompute_pass
from pc_cpu.engine.llama.context import Context, default_flash_attn
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom, groups, recompute_in_library
from pc_cpu.errors import EngineError
from pc_cpu.kvstate import ops, state_blob
from pc_cpu.pml.document_layout import with_recompute
from pc_cpu.pml.recompute import parse_policy
from tests.engine.test_documents import FUJI, NILE, PARIS, QUESTION

BANANA = "Bananas grow in hanging bunches and turn yellow when they ripen in the sun."
RAIN = "In this valley most of the rain falls in spring, and the river floods in April."
TEXTS = (FUJI, NILE, PARIS, BANANA, RAIN)
# Every question here is assembled from documents encoded apart (Engine.question: prefix="off"), each
# after the preamble alone: no exact prefix, no stand-ins.


@pytest.fixture
def engine(make_engine, tmp_path):
    """The machinery of a cache with a store (tests/engine/machinery.py Engine)."""
    return make_engine(store=tmp_path / "store")


def is_tiny(engine) -> bool:
    return engine.model.path.name.startswith("tiny")


def bit_exact(engine) -> bool:
    """Returns whether a run computed in the library must have the bits of the same run computed alone in a stream.

    On F32 weights (the tiny model) a row's result does not depend on the batch it is in, and
    with flash attention a cell's result does not depend on the slots of the cells it attends
    to, only on their order. Without flash attention (pc_cpu's default on models without a
    sliding window) llama.cpp sums the cells in slot order, and in the library a run's new cells
    sit after every staging cell, not where a stream puts them: the same values, summed in
    another order (recompute_pass module docstring). K-quant kernels round by batch shape
    (tests/conftest.py batched_prefill_logits).
    """
    return is_tiny(engine) and engine.ctx.config.flash_attn is not False


def close_to(engine, got: np.ndarray, want: np.ndarray) -> bool:
    """Returns whether a K row is within what the batch shape or the slot order can change (see bit_exact).

    The slot order alone (F32 weights, no flash attention) moved the tiny model's K rows by at
    most 4.3e-6 of their largest value (2026-12-05, the policies of the test below, every
    layer); the batch shape of K-quant kernels moves them further, hence their looser bound.
    """
    share = 1e-4 if is_tiny(engine) else 0.02
    return np.abs(got - want).max() <= share * np.abs(want).max() + (0.0 if is_tiny(engine) else 1e-3)


# The one-pass code with flash attention on, where the tiny model's rows must keep every bit (bit_exact),
# beside pc_cpu's default (off on these models).
FLASH = ["default", pytest.param("on", marks=pytest.mark.tiny_only)]


def flash_engine(make_engine, tmp_path, flash: str):
    """Returns the machinery with a store, flash attention on when `flash` says so, else pc_cpu's default."""
    engine = make_engine(store=tmp_path / "store", **({"flash_attn": True} if flash == "on" else {}))
    assert engine.ctx.config.flash_attn is (True if flash == "on" else default_flash_attn(engine.model.info))
    return engine


def build(engine, ids, policy, *, library=True, budget=None):
    """Returns the prompt, its last logits and its cells (one-stream blob), built in prompt stream 0."""
    enc = engine.encoder
    room = enc.library
    if not library:
        enc.library = None
    elif budget is not None:
        enc.library = replace(room, idle=lambda: room.idle()[:budget])
    try:
        prompt = with_recompute(engine.document_prompt(QUESTION, ids), parse_policy(policy))
        work = DocumentWork(prompt, enc, True)
        work.prepare()
        work.prefill(0)
        logits = engine.prompts.logits()
        blob = ops.restream(engine.prompts.state_get(0), 1)
        engine.prompts.seq_rm(0)
    finally:
        enc.library = room
    return prompt, logits, blob


def keys(blob, layer: int) -> dict[int, np.ndarray]:
    """Returns position -> K row at `layer` of the blob's first KV cache."""
    pos, k, _ = state_blob.layer_kv(blob, layer)
    return {int(p): row.astype(np.float64) for p, row in zip(pos, k)}


def last_layer(blob) -> int:
    """Returns the last layer of the first KV cache: its K is shaped by the attention of every layer before it."""
    return state_blob.section_layers(blob)[0] - 1


def each_run_alone(engine, prompt, plain, layer) -> dict[int, np.ndarray]:
    """Returns the K rows of every run computed alone after the cached cells before it (from `plain`), in stream 0."""
    out = {}
    for start, end in prompt.recomputed:
        engine.prompts.state_set(0, ops.restream(plain, engine.prompts.n_stream))
        engine.prompts.seq_rm(0, start, -1)
        engine.prompts.decode(prompt.tokens[start:end], range(start, end), 0, logits_last=False)
        k = keys(ops.restream(engine.prompts.state_get(0), 1), layer)
        out.update({p: k[p] for p in range(start, end)})
        engine.prompts.seq_rm(0)
    return out


def library_empty(engine) -> bool:
    return all(engine.ctx.seq_pos_max(seq) < 0 for seq in range(engine.ctx.n_seq_max))


def count_calls(monkeypatch, obj, name) -> list:
    calls = []
    original = getattr(obj, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, spy)
    return calls


# Every policy and every sequence budget on each model; their other pairings on the tiny model
# only, where they cost no time (the grouping of runs into sequences does not depend on the model).
EACH_ONCE = [("head:3", None), ("tail:4,head:2", 1), ("10%", 2)]
POLICY_BUDGET = [pair if pair in EACH_ONCE else pytest.param(*pair, marks=pytest.mark.tiny_only)
                 for pair in itertools.product(["head:3", "tail:4,head:2", "10%"], [None, 1, 2])]


@pytest.mark.parametrize("flash", FLASH)
@pytest.mark.parametrize("policy, budget", POLICY_BUDGET)
def test_each_run_is_computed_after_the_cached_cells_before_it(make_engine, tmp_path, policy, budget, flash):
    engine = flash_engine(make_engine, tmp_path, flash)
    ids = [engine.add(text) for text in TEXTS]
    prompt, _, got = build(engine, ids, policy, budget=budget)
    assert len(prompt.recomputed) >= 4
    _, _, plain = build(engine, ids, "0")
    layer = last_layer(got)
    want, got_k, plain_k = each_run_alone(engine, prompt, plain, layer), keys(got, layer), keys(plain, layer)
    assert sorted(got_k) == list(range(prompt.end))  # every position once, the runs' at theirs
    for p, row in want.items():
        assert np.array_equal(got_k[p], row) if bit_exact(engine) else close_to(engine, got_k[p], row), p
    assert any(not np.array_equal(plain_k[p], want[p]) for p in want)  # the runs did change
    for p in range(prompt.tail_start):
        if p not in want:
            assert np.array_equal(got_k[p], plain_k[p]), p  # the rest: the moved encodings' bytes
    assert library_empty(engine)


def test_all_runs_go_in_one_decode_and_nothing_is_read_back_per_run(engine, monkeypatch):
    ids = [engine.add(text) for text in TEXTS]
    library_decodes = count_calls(monkeypatch, engine.ctx, "_decode_chunk")
    prompt_decodes = count_calls(monkeypatch, engine.prompts, "decode")
    reads = count_calls(monkeypatch, engine.prompts, "state_get")
    together = engine.encoder.library.together  # 1 on a sliding-window model (LibraryRoom)
    prompt, _, _ = build(engine, ids, "head:3")
    assert len(prompt.recomputed) == 4 and len(library_decodes) == (4 if together == 1 else 1)
    assert [len(tokens) for _, tokens, *_ in prompt_decodes] == [len(prompt.tail)]  # the question, nothing else
    assert len(reads) == 1  # build's own read of the result
    library_decodes.clear()
    build(engine, ids, "head:3", budget=3)
    assert len(library_decodes) == (4 if together == 1 else 2)  # 4 runs, 3 sequences: two groups


@pytest.mark.parametrize("flash", FLASH)
def test_a_single_run_is_computed_in_the_prompt_stream_as_before(make_engine, tmp_path, monkeypatch, flash):
    # One run (head:3 of the second of two documents) keeps the stream path, so recompute="all"
    # stays the full prefill bit for bit (test_documents.py); the one-pass code, called on it
    # directly, gives the same cells (bit for bit where bit_exact says so).
    engine = flash_engine(make_engine, tmp_path, flash)
    ids = [engine.add(text) for text in (FUJI, PARIS)]
    library_decodes = count_calls(monkeypatch, engine.ctx, "_decode_chunk")
    prompt, logits, stream_path = build(engine, ids, "head:3")
    assert len(prompt.recomputed) == 1 and not library_decodes
    _, _, plain = build(engine, ids, "0")
    enc = engine.encoder
    cached = ops.restore_blob([ops.restream(plain, 1)], 1)
    assert recompute_in_library(enc.library, cached, prompt.recomputed, prompt.tokens[:prompt.tail_start],
                                engine.prompts, 0)
    assert len(library_decodes) == 1
    engine.prompts.seq_rm(0, prompt.tail_start, -1)
    engine.prompts.decode(prompt.tail, range(prompt.tail_start, prompt.end), 0)
    one_pass = ops.restream(engine.prompts.state_get(0), 1)
    if bit_exact(engine):
        assert one_pass == stream_path and np.array_equal(engine.prompts.logits(), logits)
    else:
        assert np.argmax(engine.prompts.logits()) == np.argmax(logits)
        layer = last_layer(one_pass)
        got_k, want_k = keys(one_pass, layer), keys(stream_path, layer)
        assert all(close_to(engine, got_k[p], want_k[p]) for p in want_k)
    engine.prompts.seq_rm(0)
    assert library_empty(engine)


@pytest.mark.parametrize("policy", ["head:4", "10%", "relevant:1", "tail:4,head:2"])
def test_answers_run_and_every_borrowed_sequence_ends_empty(engine, policy):
    # Answered by the scheduler, as `ask` answers (its DocumentWork, Engine.question).
    ids = [engine.add(text) for text in (FUJI, NILE, PARIS, BANANA)]
    prompt = with_recompute(engine.document_prompt(QUESTION, ids), parse_policy(policy))
    result = engine.answer(engine.question(QUESTION, ids, recompute=policy), max_tokens=4)
    assert result.token_ids and len(result.token_ids) <= 4
    assert result.uncached_tokens == len(prompt.tail) + prompt.recomputed_tokens
    assert result.cached_tokens == prompt.cached_tokens
    assert library_empty(engine)
    again = engine.answer(engine.question(QUESTION, ids, recompute=policy), max_tokens=4)
    assert again.text == result.text  # an empty library: the same layout, the same bits


def _fail_in_decode(ctx: Context):
    original = ctx.decode

    def decode(tokens, positions, seqs, **kwargs):
        # The first library decode of the recompute (several runs, or one on a sliding-window model)
        original(tokens[:1], positions[:1], seqs[:1] if not isinstance(seqs, int) else seqs, **kwargs)
        raise RuntimeError("injected")  # some cells computed, then a failure
    return decode


def _fail_in_move(library, staging, prompts, slot):
    prompts.state_set(slot, ops.restream(library.state_get(staging), prompts.n_stream))  # filled, then a failure
    raise RuntimeError("injected")


@pytest.mark.parametrize("where", ["decode", "move"])
def test_a_failure_mid_way_leaves_no_cells_behind(engine, monkeypatch, where):
    ids = [engine.add(text) for text in TEXTS]
    prompt = with_recompute(engine.document_prompt(QUESTION, ids), parse_policy("head:3"))
    with monkeypatch.context() as patch:
        if where == "decode":
            patch.setattr(engine.ctx, "decode", _fail_in_decode(engine.ctx))
        else:
            patch.setattr(recompute_pass, "move_to_stream", _fail_in_move)
        work = DocumentWork(prompt, engine.encoder, True)
        work.prepare()
        with pytest.raises(RuntimeError, match="injected"):
            work.prefill(0)
    assert library_empty(engine)
    assert engine.prompts.seq_pos_max(0) < 0 and engine.prompts.seq_pos_max(engine.roles.workspace) < 0
    result = engine.answer(engine.question(QUESTION, ids, recompute="head:3"), max_tokens=2)
    assert result.token_ids and library_empty(engine)


@pytest.mark.parametrize("why", ["no idle sequence", "no room"])
def test_without_a_sequence_or_room_the_runs_are_computed_in_the_stream(engine, monkeypatch, why):
    ids = [engine.add(text) for text in TEXTS]
    _, stream_logits, stream_cells = build(engine, ids, "head:3", library=False)
    enc = engine.encoder
    if why == "no idle sequence":
        monkeypatch.setattr(enc, "library", replace(enc.library, idle=lambda: []))
    else:
        def full(seq, data):
            raise EngineError("llama.cpp could not restore: the context has no free cells")
        monkeypatch.setattr(engine.ctx, "state_set", full)
    library_decodes = count_calls(monkeypatch, engine.ctx, "_decode_chunk")
    _, logits, cells = build(engine, ids, "head:3")
    assert not library_decodes and cells == stream_cells and np.array_equal(logits, stream_logits)
    assert library_empty(engine)


def test_busy_or_invalid_sequences_are_never_borrowed(engine):
    ctx = engine.ctx
    busy = engine.roles.libraries[0]
    ctx.decode([1, 2, 3], range(3), busy, logits_last=False)  # cells someone holds
    try:
        room = LibraryRoom(ctx, engine.roles.slots, lambda: [busy, -1, ctx.n_seq_max, 0, 7, 7, 8])
        assert room.borrow(0) == [7, 8]
    finally:
        ctx.seq_rm(busy)
    with pytest.raises(EngineError, match="staging"):
        recompute_in_library(room, b"", [(1, 2)], [1, 2, 3], engine.prompts, engine.roles.workspace)
    with pytest.raises(EngineError, match="sorted"):
        recompute_in_library(room, b"", [(2, 3), (1, 2)], [1, 2, 3], engine.prompts, 0)
    assert groups([(1, 2), (3, 4), (5, 6)], 2) == [[(1, 2), (3, 4)], [(5, 6)]]


SCHEMA = ('<schema name="s"><system>Be brief.</system><user><module name="a">The ferry leaves at nine from pier '
          'four.</module><module name="b">Tickets cost twelve euros.</module></user></schema>')
PROMPT = '<prompt schema="s"><a/><b/><user>When does the ferry leave?</user></prompt>'


def test_resident_modules_keep_their_cells(engine):
    layout = engine.load(SCHEMA)
    plan = engine.plan(layout, PROMPT)
    before = engine.prefill_logits(layout, plan)
    ctx = engine.ctx
    resident = [(seq, ctx.seq_pos_min(seq), ctx.seq_pos_max(seq)) for seq in range(ctx.n_seq_max)]
    assert any(hi >= 0 for _, _, hi in resident)
    ids = [engine.add(text) for text in TEXTS]
    result = engine.answer(engine.question(QUESTION, ids, recompute="head:3"), max_tokens=2)
    assert result.token_ids
    assert [(seq, ctx.seq_pos_min(seq), ctx.seq_pos_max(seq)) for seq in range(ctx.n_seq_max)] == resident
    assert np.array_equal(engine.prefill_logits(layout, plan), before)
