"""Tiny random-weight GGUFs of architectures pc_cpu refuses, to check the refusal at load.

Each loads in llama.cpp (the tensors and keys its loader requires for the architecture, from
vendor/llama.cpp/src/models/<arch>.cpp) and stands in for a family:
- mamba: recurrent memory (RWKV, Mamba 2 alike);
- jamba: hybrid memory, a Mamba layer then an attention layer (LFM2, Granite 4 H, Qwen3-Next alike);
- qwen2vl: multi-section RoPE (M-RoPE), which the relocator does not know;
- gpt2: no RoPE (learned absolute positions).
numpy shapes are (out, in): GGUF's ne reversed.
"""

from __future__ import annotations

import pathlib

import numpy as np
from gguf import GGUFWriter

from tests.tiny_gguf import write_tiny_gguf, write_tiny_llama_gguf

N_EMBD = 32
N_LAYER = 1
N_CTX = 512


def _matrix(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _ssm_hparams(w: GGUFWriter, *, n_layer: int, d_conv: int, d_inner: int, d_state: int, dt_rank: int) -> None:
    """Writes the keys every Mamba-style architecture requires."""
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)


def write_tiny_mamba_gguf(path: pathlib.Path) -> pathlib.Path:
    """Writes a 1-layer Mamba: recurrent memory."""
    d_inner, d_state, d_conv, dt_rank = 2 * N_EMBD, 4, 4, 2  # llama.cpp requires d_inner = 2 * n_embd

    def hparams(w: GGUFWriter) -> None:
        _ssm_hparams(w, n_layer=N_LAYER, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=dt_rank)

    def weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
        out = {"token_embd.weight": _matrix(rng, n_vocab, N_EMBD)}
        for i in range(N_LAYER):
            b = f"blk.{i}"
            out |= {
                f"{b}.attn_norm.weight": np.ones(N_EMBD, np.float32),
                f"{b}.ssm_in.weight": _matrix(rng, 2 * d_inner, N_EMBD),
                f"{b}.ssm_conv1d.weight": _matrix(rng, d_inner, d_conv),
                f"{b}.ssm_conv1d.bias": np.zeros(d_inner, np.float32),
                f"{b}.ssm_x.weight": _matrix(rng, dt_rank + 2 * d_state, d_inner),
                f"{b}.ssm_dt.weight": _matrix(rng, d_inner, dt_rank),
                f"{b}.ssm_dt.bias": np.zeros(d_inner, np.float32),
                f"{b}.ssm_a": -np.ones((d_inner, d_state), np.float32),
                f"{b}.ssm_d": np.ones(d_inner, np.float32),
                f"{b}.ssm_out.weight": _matrix(rng, N_EMBD, d_inner),
            }
        out["output_norm.weight"] = np.ones(N_EMBD, np.float32)
        return out

    return write_tiny_gguf(path, arch="mamba", name="pc_cpu tiny mamba", hparams=hparams, weights=weights)


def write_tiny_jamba_gguf(path: pathlib.Path) -> pathlib.Path:
    """Writes a 2-layer Jamba: a Mamba layer (no KV heads), then an attention layer."""
    d_inner, d_state, d_conv, dt_rank, n_head, n_head_kv, n_ff = 2 * N_EMBD, 4, 4, 2, 4, 2, 64
    head_dim = N_EMBD // n_head

    def hparams(w: GGUFWriter) -> None:
        _ssm_hparams(w, n_layer=2, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=dt_rank)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv([0, n_head_kv])  # 0 KV heads marks the recurrent layer

    def weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
        ones = lambda n: np.ones(n, np.float32)  # noqa: E731
        ffn = lambda b: {f"{b}.ffn_norm.weight": ones(N_EMBD), f"{b}.ffn_gate.weight": _matrix(rng, n_ff, N_EMBD),  # noqa: E731
                         f"{b}.ffn_down.weight": _matrix(rng, N_EMBD, n_ff), f"{b}.ffn_up.weight": _matrix(rng, n_ff, N_EMBD)}
        return {
            "token_embd.weight": _matrix(rng, n_vocab, N_EMBD),
            "blk.0.attn_norm.weight": ones(N_EMBD),
            "blk.0.ssm_in.weight": _matrix(rng, 2 * d_inner, N_EMBD),
            "blk.0.ssm_conv1d.weight": _matrix(rng, d_inner, d_conv),
            "blk.0.ssm_conv1d.bias": np.zeros(d_inner, np.float32),
            "blk.0.ssm_x.weight": _matrix(rng, dt_rank + 2 * d_state, d_inner),
            "blk.0.ssm_dt_norm.weight": ones(dt_rank),
            "blk.0.ssm_dt.weight": _matrix(rng, d_inner, dt_rank),
            "blk.0.ssm_dt.bias": np.zeros(d_inner, np.float32),
            "blk.0.ssm_b_norm.weight": ones(d_state),
            "blk.0.ssm_c_norm.weight": ones(d_state),
            "blk.0.ssm_a": -np.ones((d_inner, d_state), np.float32),
            "blk.0.ssm_d": ones(d_inner),
            "blk.0.ssm_out.weight": _matrix(rng, N_EMBD, d_inner),
            **ffn("blk.0"),
            "blk.1.attn_norm.weight": ones(N_EMBD),
            "blk.1.attn_q.weight": _matrix(rng, N_EMBD, N_EMBD),
            "blk.1.attn_k.weight": _matrix(rng, n_head_kv * head_dim, N_EMBD),
            "blk.1.attn_v.weight": _matrix(rng, n_head_kv * head_dim, N_EMBD),
            "blk.1.attn_output.weight": _matrix(rng, N_EMBD, N_EMBD),
            **ffn("blk.1"),
            "output_norm.weight": ones(N_EMBD),
        }

    return write_tiny_gguf(path, arch="jamba", name="pc_cpu tiny jamba", hparams=hparams, weights=weights)


def write_tiny_gpt2_gguf(path: pathlib.Path) -> pathlib.Path:
    """Writes a 1-layer GPT-2: learned absolute positions, no RoPE."""
    n_head, n_ff = 4, 64

    def hparams(w: GGUFWriter) -> None:
        w.add_context_length(N_CTX)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_layer_norm_eps(1e-5)

    def weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
        zeros, ones = (lambda n: np.zeros(n, np.float32)), (lambda n: np.ones(n, np.float32))
        out = {"token_embd.weight": _matrix(rng, n_vocab, N_EMBD), "position_embd.weight": _matrix(rng, N_CTX, N_EMBD)}
        for i in range(N_LAYER):
            b = f"blk.{i}"
            out |= {
                f"{b}.attn_norm.weight": ones(N_EMBD), f"{b}.attn_norm.bias": zeros(N_EMBD),
                f"{b}.attn_qkv.weight": _matrix(rng, 3 * N_EMBD, N_EMBD), f"{b}.attn_qkv.bias": zeros(3 * N_EMBD),
                f"{b}.attn_output.weight": _matrix(rng, N_EMBD, N_EMBD), f"{b}.attn_output.bias": zeros(N_EMBD),
                f"{b}.ffn_norm.weight": ones(N_EMBD), f"{b}.ffn_norm.bias": zeros(N_EMBD),
                f"{b}.ffn_up.weight": _matrix(rng, n_ff, N_EMBD), f"{b}.ffn_up.bias": zeros(n_ff),
                f"{b}.ffn_down.weight": _matrix(rng, N_EMBD, n_ff), f"{b}.ffn_down.bias": zeros(N_EMBD),
            }
        out |= {"output_norm.weight": ones(N_EMBD), "output_norm.bias": zeros(N_EMBD)}
        return out

    return write_tiny_gguf(path, arch="gpt2", name="pc_cpu tiny gpt2", hparams=hparams, weights=weights)


def write_tiny_mrope_gguf(path: pathlib.Path) -> pathlib.Path:
    """Writes the tiny Llama as a Qwen2-VL: the same tensors, with M-RoPE sections (head size 16)."""
    return write_tiny_llama_gguf(path, arch="qwen2vl", n_layer=1,
                                 extra=lambda w: w.add_array("qwen2vl.rope.dimension_sections", [4, 2, 2, 0]))
