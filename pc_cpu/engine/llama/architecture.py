"""Gives the reason pc_cpu cannot serve a model's architecture correctly, or None when it can.

Modular caching rests on three facts about the model, all read from llama.cpp's view of the GGUF
(never from the model's name):
- its memory is KV cells, one per position: a module's cells can be shared into a prompt by
  position range (partial `seq_cp`). A recurrent state (Mamba, RWKV) summarizes a whole sequence
  in one cell, and a hybrid (Jamba, LFM2, Granite 4 H) has such layers beside attention;
- it is a causal decoder: an encoder (T5) or a diffusion model does not decode left to right;
- positions enter through RoPE of a kind the relocator knows (pc_cpu.kvstate.rope.RopeMode):
  moving cells to another position (llama.cpp's K-shift, or our relocation of saved bytes) is then
  an exact rotation. Without RoPE (absolute positions, ALiBi) nothing pc_cpu does with positions
  has been checked, and multi-section RoPE (M-RoPE, vision) rotates K by more than one position.
"""

from __future__ import annotations

from dataclasses import dataclass

from pc_cpu.kvstate.rope import RopeMode

# llama.cpp's enum llama_rope_type (include/llama.h)
ROPE_TYPE_NAMES = {-1: "none", 0: "normal", 2: "neox", 8: "mrope", 24: "vision", 40: "imrope"}


@dataclass(frozen=True)
class ArchitectureFacts:
    """What llama.cpp says about a loaded model's architecture."""

    architecture: str   # GGUF general.architecture
    rope_type: int      # llama_model_rope_type
    recurrent: bool     # llama_model_is_recurrent
    hybrid: bool        # llama_model_is_hybrid
    has_encoder: bool   # llama_model_has_encoder
    diffusion: bool     # llama_model_is_diffusion


def refusal(facts: ArchitectureFacts) -> str | None:
    """Returns why pc_cpu cannot serve this architecture (a sentence ending in the fix), or None."""
    arch = f"architecture {facts.architecture!r}"
    fix = "; use a transformer with RoPE, e.g. --model qwen2.5-coder-0.5b (`pc-cpu models` lists them)"
    if facts.recurrent:
        return (f"{arch} keeps a recurrent state per sequence, not one KV cell per position, so a module's "
                f"state cannot be shared into a prompt by position range{fix}")
    if facts.hybrid:
        return (f"{arch} has recurrent layers beside attention (hybrid memory), whose state cannot be "
                f"shared into a prompt by position range{fix}")
    if facts.has_encoder:
        return f"{arch} is an encoder-decoder model; pc_cpu caches the KV cells of a causal decoder{fix}"
    if facts.diffusion:
        return f"{arch} is a diffusion model, which does not decode left to right{fix}"
    if facts.rope_type == -1:
        return (f"{arch} does not use RoPE (its positions are absolute or ALiBi), so moving cached cells "
                f"to a module's position is not known to be exact{fix}")
    if facts.rope_type not in {mode.value for mode in RopeMode}:
        name = ROPE_TYPE_NAMES.get(facts.rope_type, "unknown")
        known = ", ".join(ROPE_TYPE_NAMES[mode.value] for mode in RopeMode)
        return (f"{arch} uses RoPE type {name!r} ({facts.rope_type}), which the relocator does not know "
                f"(it knows {known}), so moving cached cells to a module's position would be wrong{fix}")
    return None
