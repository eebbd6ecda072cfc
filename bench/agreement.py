"""Same tokens, same answer: do cached answers agree token for token across the tiers that served them?

A library schema holds the gold passages of `--library` NaturalQuestions questions, one
module each, after a system message. Each of `--n` prompts imports its question's gold
passage and `--docs - 1` others picked at random (in schema order), then asks the question.
Greedy answers of every prompt are taken five ways, all with the same model, threads and
tokens:

- fresh: process 1 encodes the modules (another schema resident beside them);
- context: again, the modules now resident;
- ram: process 1's modules evicted from the context and restored from RAM;
- disk: a second PromptCache with the same store directory (nothing resident, empty RAM);
- full prefill: `use_cache=False`, and llama-cpp-python's `Llama` on the same tokens.

It prints how many answers are identical to the fresh ones (and the full prefill to Llama's).

    python bench/agreement.py --threads 2 --n 200 [--model NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

import llama_cpp
import numpy as np

from pc_cpu import PromptCache
from pc_cpu.benchmarks.evaldata import load_nq
from pc_cpu.engine.llama.extra_buffers import llama_peer
from pc_cpu.benchmarks.prompts import document_text
from pc_cpu.pml.text import escape_text
from pc_cpu.model_path import resolve_model_path

SYSTEM = "Write a high-quality answer for the given question using only the provided search results."
OTHER = ('<schema name="other"><module name="x">' + "Filler about gardens, roses and hedges. " * 40
         + "</module></schema>")


def library_schema(passages) -> str:
    modules = "".join(f'<module name="d{i}">{escape_text(document_text(i + 1, p))}</module>' for i, p in enumerate(passages))
    return f'<schema name="lib"><system>{escape_text(SYSTEM)}</system><user>{modules}</user></schema>'


def prompts(questions, n: int, docs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gold = i % len(questions)
        others = rng.sample([j for j in range(len(questions)) if j != gold], docs - 1)
        imports = "".join(f"<d{j}/>" for j in sorted(others + [gold]))
        question = escape_text(f"Question: {questions[gold].question}\nAnswer:")
        out.append(f'<prompt schema="lib">{imports}<user>{question}</user></prompt>')
    return out


def greedy_llama(llama, tokens: list[int], max_tokens: int) -> list[int]:
    """Returns Llama's greedy continuation of `tokens` (argmax of the raw logits, as pc_cpu's temperature 0)."""
    llama.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llama.ctx), True)
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    out = []
    llama.eval(tokens)
    for _ in range(max_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),))
        token = int(np.argmax(logits))
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        out.append(token)
        llama.eval([token])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--library", type=int, default=40)
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-llama", action="store_true", help="skip the comparison with llama-cpp-python's Llama")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    questions = load_nq()[: args.library]
    schema = library_schema([q.gold for q in questions])
    texts = prompts(questions, args.n, args.docs, args.seed)
    path = resolve_model_path(args.model)
    common = dict(threads=args.threads, n_ctx=8192, flash_attn=False)
    answers: dict[str, list[list[int]]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as store:
        with PromptCache(path, store=store, **common) as first:
            first.load_schema(OTHER)
            first.load_schema(schema, encode=False)
            answers["fresh"] = [first.generate(p, max_tokens=args.max_tokens).token_ids for p in texts]
            answers["context"] = [first.generate(p, max_tokens=args.max_tokens).token_ids for p in texts]
            ram = []
            for p in texts:
                first.evict("lib")
                ram.append(first.generate(p, max_tokens=args.max_tokens).token_ids)
            answers["ram"] = ram
            answers["full_prefill"] = [first.generate(p, max_tokens=args.max_tokens, use_cache=False).token_ids
                                       for p in texts]
            tokens = [list(first.plan(p).tokens) for p in texts]
        with PromptCache(path, store=store, **common) as second:
            second.load_schema(schema, encode=False)
            disk = []
            for p in texts:
                second.evict("lib")
                ram_tier = second.store.tiers[0]
                for key in ram_tier.keys():  # every prompt's modules come from disk
                    ram_tier.remove(key)
                disk.append(second.generate(p, max_tokens=args.max_tokens).token_ids)
            answers["disk"] = disk
    if not args.no_llama:
        llama = llama_peer(path, n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads,
                                flash_attn=False, verbose=False)
        answers["llama"] = [greedy_llama(llama, t, args.max_tokens) for t in tokens]
        llama.close()

    def same(a: str, b: str) -> int:
        return sum(x == y for x, y in zip(answers[a], answers[b]))

    report = {"model": path.name, "n": args.n, "docs": args.docs, "library": args.library,
              "threads": args.threads, "seconds": round(time.perf_counter() - started, 1),
              "identical_to_fresh": {k: same("fresh", k) for k in ("context", "ram", "disk")}}
    if "llama" in answers:
        report["full_prefill_identical_to_llama"] = same("full_prefill", "llama")
    report["cached_identical_to_full_prefill"] = same("fresh", "full_prefill")
    print(json.dumps(report) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))


if __name__ == "__main__":
    main()
