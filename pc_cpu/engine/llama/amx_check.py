"""Runs one AMX matmul in this process and prints 'ok' if it survives (`python -m pc_cpu.engine.llama.amx_check`).

Run as a child by pc_cpu.engine.llama.extra_buffers: on CPUs where llama.cpp's AMX path is broken
the matmul kills the process (SIGSEGV at `ldtilecfg`), and only the child dies.

The model is written here, tiny and random: one Llama block, width 256, every matrix Q8_0 or
Q4_0, both types with AMX kernels, and every dimension a multiple of the AMX tile sizes
(ggml-cpu/amx/amx.cpp supports_op: rows % 32, Q8_0/Q4_0 columns % 32), so that with extra
buffers on, llama.cpp puts the weights in AMX buffers. It has no tokenizer ("none": dummy
tokens), so decoding goes by token ids. A batch of 64 tokens takes the AMX tile path (a
one-token batch takes the VNNI path instead), on two threads or more, since the bug is in
how worker threads get tile permission.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

N_EMBD, N_FF, N_HEAD, N_VOCAB, N_BATCH = 256, 512, 4, 256, 64


def write_model(path: Path) -> None:
    """Writes the check's one-block Llama GGUF to `path` (seeded: the same bytes every time)."""
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)
    writer.add_tokenizer_model("none")

    def matrix(name: str, rows: int, cols: int, kind) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        quantized = gguf.quants.quantize(data, kind)
        writer.add_tensor(name, quantized, raw_dtype=kind)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    q8, q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    matrix("token_embd.weight", N_VOCAB, N_EMBD, q8)
    norm("blk.0.attn_norm.weight", N_EMBD)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        matrix(f"blk.0.{name}.weight", N_EMBD, N_EMBD, q8)
    norm("blk.0.ffn_norm.weight", N_EMBD)
    matrix("blk.0.ffn_gate.weight", N_FF, N_EMBD, q4)
    matrix("blk.0.ffn_up.weight", N_FF, N_EMBD, q4)
    matrix("blk.0.ffn_down.weight", N_EMBD, N_FF, q4)
    norm("output_norm.weight", N_EMBD)
    matrix("output.weight", N_VOCAB, N_EMBD, q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run(path: Path, threads: int) -> None:
    """Loads `path` with extra buffer types on and decodes one batch of N_BATCH tokens, then one token."""
    import llama_cpp

    from pc_cpu.engine.llama.log import set_llama_verbose

    set_llama_verbose(False)
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit("llama.cpp could not load the check model")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 256, N_BATCH, N_BATCH
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create the check context")
    try:
        tokens = (llama_cpp.llama_token * N_BATCH)(*[(7 * i) % N_VOCAB for i in range(N_BATCH)])
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, N_BATCH)) != 0:
            raise SystemExit("llama_decode refused the check batch")
        one = (llama_cpp.llama_token * 1)(1)
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
            raise SystemExit("llama_decode refused the check token")
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def main() -> None:
    threads = max(2, min(8, os.cpu_count() or 2))
    with tempfile.TemporaryDirectory(prefix="pc_cpu-amx-check-") as tmp:
        path = Path(tmp) / "amx-check.gguf"
        write_model(path)
        run(path, threads)
    print("ok", flush=True)


if __name__ == "__main__":
    sys.exit(main())
