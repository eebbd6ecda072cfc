"""Whether a q8_0 K/V cache is worth offering: bytes per token, answers and speed against F16, on NQ questions.

llama.cpp quantizes V only with flash attention on, so three settings, each a full prefill of the
same tokens through llama-cpp-python's `Llama` (loaded as pc_cpu loads models), greedy:
- "f16, flash off": pc_cpu's default on non-sliding-window models;
- "f16, flash on";
- "q8_0, flash on": K and V quantized to q8_0.
Items: --n NQ-open questions over 5 passages (the gold one and 4 others, pc_cpu.benchmarks.evaldata,
read in place), laid out as `PromptCache.ask` lays them out. Reported per setting: accuracy (an
answer in the reply, as `pc-cpu bench documents` scores it), answers that differ from "f16, flash
on" (same attention kernel, only the cache type changed), bytes of a sequence's state per token
(what the store keeps), prefill ms p50 and ms per generated token p50.

    python bench/kv_cache_type.py [--model qwen2.5-coder-0.5b] [--threads 2] [--n 40] [--answer-tokens 24]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

from pc_cpu import PromptCache
from pc_cpu.benchmarks.documents import SYSTEM, correct, passage_text
from pc_cpu.benchmarks.evaldata import doc_items, load_nq
from pc_cpu.engine.llama.extra_buffers import llama_peer

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402

GGML_F16, GGML_Q8_0 = 1, 8
SETTINGS = {"f16, flash off": (GGML_F16, False), "f16, flash on": (GGML_F16, True), "q8_0, flash on": (GGML_Q8_0, True)}


def answer(llm, tokens: list[int], max_tokens: int) -> dict:
    """Returns the greedy answer to `tokens` from an empty context, with its timings and the state's bytes."""
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    t0 = time.perf_counter()
    llm.eval(tokens)
    prefill_ms = (time.perf_counter() - t0) * 1000
    state_bytes = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out, t1 = [], time.perf_counter()
    for _ in range(max_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        token = int(np.argmax(logits))
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        out.append(token)
        llm.eval([token])
    per_token = (time.perf_counter() - t1) * 1000 / max(len(out), 1)
    return {"tokens": out, "text": llm.detokenize(out).decode("utf-8", errors="ignore"), "prefill_ms": prefill_ms,
            "ms_per_token": per_token, "state_bytes_per_token": state_bytes / len(tokens)}


def run(model: str, threads: int, n: int, answer_tokens: int) -> dict:
    items = doc_items(load_nq(), 5, n)
    with PromptCache(model, threads=threads, n_ctx=4096, store=False, remote_store=False) as pc:
        path = pc.model.path
        prompts = [list(pc.documents.prompt(item.question, [passage_text(p) for p in item.passages],
                                            system=SYSTEM).tokens) for item in items]
    rows: dict[str, list[dict]] = {}
    for name, (kv_type, flash) in SETTINGS.items():
        llm = llama_peer(path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, flash_attn=flash,
                         type_k=kv_type, type_v=kv_type, verbose=False)
        try:
            rows[name] = [answer(llm, tokens, answer_tokens) for tokens in prompts]
        finally:
            llm.close()
        print(name, "done", file=sys.stderr, flush=True)
    summary = {}
    for name, got in rows.items():
        summary[name] = {
            "accuracy": round(sum(correct(r["text"], item.answers) for r, item in zip(got, items)) / n, 3),
            "answers_differing_from_f16_flash_on": sum(a["tokens"] != b["tokens"]
                                                      for a, b in zip(got, rows["f16, flash on"])),
            "state_bytes_per_token": round(statistics.median(r["state_bytes_per_token"] for r in got)),
            "prefill_ms_p50": round(statistics.median(r["prefill_ms"] for r in got), 1),
            "ms_per_token_p50": round(statistics.median(r["ms_per_token"] for r in got), 2)}
    return {"model": path.name, "threads": threads, "n": n, "prompt_tokens_p50": statistics.median(map(len, prompts)),
            "summary": summary, "answers": {name: [r["text"] for r in got] for name, got in rows.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kv_cache_type.json")
    args = parser.parse_args(argv)
    report = new_report("kv_cache_type.py", argv)
    report["result"] = result = run(args.model, args.threads, args.n, args.answer_tokens)
    print(result["summary"], flush=True)
    write_report(report, args.out, [])


if __name__ == "__main__":
    main()
