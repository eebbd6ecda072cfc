"""A model whose architecture breaks modular caching is refused at load, saying why (from GGUF metadata)."""

from __future__ import annotations

import dataclasses

import pytest

from pc_cpu.engine.llama.architecture import ArchitectureFacts, refusal
from pc_cpu.errors import UnsupportedModelError
from tests.conftest import smollm2_path
from tests.tiny_archs import write_tiny_gpt2_gguf, write_tiny_jamba_gguf, write_tiny_mamba_gguf, write_tiny_mrope_gguf

QWEN2 = ArchitectureFacts(architecture="qwen2", rope_type=2, recurrent=False, hybrid=False, has_encoder=False,
                          diffusion=False)


def test_rope_transformers_are_served():
    assert refusal(QWEN2) is None
    assert refusal(dataclasses.replace(QWEN2, architecture="llama", rope_type=0)) is None


@pytest.mark.parametrize(("change", "says"), [
    ({"recurrent": True}, "recurrent state"),
    ({"hybrid": True}, "hybrid memory"),
    ({"has_encoder": True}, "encoder-decoder"),
    ({"diffusion": True}, "diffusion"),
    ({"rope_type": -1}, "does not use RoPE"),
    ({"rope_type": 8}, "RoPE type 'mrope' (8), which the relocator does not know"),
    ({"rope_type": 40}, "RoPE type 'imrope' (40)"),
    ({"rope_type": 99}, "RoPE type 'unknown' (99)"),
])
def test_each_unsupported_trait_is_refused_with_its_reason(change, says):
    reason = refusal(dataclasses.replace(QWEN2, **change))
    assert reason is not None and says in reason and "pc-cpu models" in reason


@pytest.mark.parametrize(("write", "says"), [
    (write_tiny_mamba_gguf, "architecture 'mamba' keeps a recurrent state per sequence"),
    (write_tiny_jamba_gguf, "architecture 'jamba' has recurrent layers beside attention (hybrid memory)"),
    (write_tiny_gpt2_gguf, "architecture 'gpt2' does not use RoPE"),
    (write_tiny_mrope_gguf, "architecture 'qwen2vl' uses RoPE type 'mrope'"),
])
def test_a_gguf_of_a_refused_architecture_is_refused_at_load(tmp_path, write, says):
    from pc_cpu import PromptCache

    smollm2_path()  # the tokenizer source; skips with the reason when missing
    path = write(tmp_path / "model.gguf")
    with pytest.raises(UnsupportedModelError, match="cannot serve 'model.gguf'") as err:
        PromptCache(path, n_ctx=256, threads=1)
    assert says in str(err.value)
