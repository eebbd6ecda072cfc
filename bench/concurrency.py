"""Throughput and TTFT of N concurrent prompts that share one ~2,000-token module (serving).

Shared: prompts import the module, so every prompt's sequence holds the same
cells (seq_cp) and they decode together in one batch per step. Private: the same
prompts with use_cache=False, so each computes and holds its own copy of the
module's cells. Same model, context, threads and tokens in one run.

    python bench/concurrency.py --threads 2 [--tokens 2000] [--gen 32] [--levels 1 2 4 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from pc_cpu import PromptCache
from pc_cpu.demo import DOCS


def module_text(pc: PromptCache, target_tokens: int) -> str:
    """Returns demo text repeated to about `target_tokens` tokens."""
    unit = " ".join(DOCS.values())
    reps = max(1, round(target_tokens / len(pc.model.tokenize(unit, special=False))))
    return " ".join([unit] * reps)


def run_level(pc: PromptCache, n: int, gen: int, *, use_cache: bool) -> dict:
    """Runs n prompts at once; returns wall time, tokens/s, TTFT median and the KV cells they held."""
    prompts = [f'<prompt schema="conc"><doc/> Question {i}: what is the longest structure described? A:</prompt>'
               for i in range(n)]
    results = [None] * n

    def work(i: int) -> None:
        results[i] = pc.generate(prompts[i], max_tokens=gen, use_cache=use_cache)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    own = sum(r.uncached_tokens + len(r.token_ids) for r in results)  # cells each prompt adds
    shared = pc.schemas.resident_cells if use_cache else 0
    return {"n": n, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "ttft_ms_median": round(statistics.median(r.ttft_ms for r in results), 1),
            "kv_cells": shared + own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--decode", choices=("invariant", "batched", "both"), default="invariant",
                        help="invariant: one llama_decode per prompt and step (the default, same answer as alone); "
                             "batched: one for all; both: shared prompts only, the two side by side, alternating")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    top = max(args.levels)
    n_ctx = args.tokens + args.gen + 256  # one prompt's positions: every prompt has a stream of its own
    modes = {"invariant": [True], "batched": [False], "both": [True, False]}[args.decode]
    caches = {}
    for invariant in modes:
        pc = PromptCache(args.model, threads=args.threads, n_ctx=n_ctx, parallel=top, store=False,
                         batch_invariant=invariant)
        pc.load_schema(f'<schema name="conc"><module name="doc">{module_text(pc, args.tokens)}</module></schema>')
        pc.generate('<prompt schema="conc"><doc/> warm-up</prompt>', max_tokens=2)
        caches[invariant] = pc
    for n in args.levels:
        for invariant, pc in caches.items():
            for use_cache in (True, False) if len(caches) == 1 else (True,):
                row = run_level(pc, n, args.gen, use_cache=use_cache)
                row["mode"] = "shared" if use_cache else "private"
                row["decode"] = "invariant" if invariant else "batched"
                print(json.dumps(row) if args.json else
                      f"{row['mode']:>8} {row['decode']:>9} n={n}: {row['tokens_per_s']:7.1f} tok/s  "
                      f"ttft p50 {row['ttft_ms_median']:9.1f} ms  wall {row['wall_s']:7.2f} s  "
                      f"kv cells {row['kv_cells']}", flush=True)
    for pc in caches.values():
        print(json.dumps({"module_tokens": pc.schemas.layout("conc").cached_cells,
                          "max_batch": pc.workbench.scheduler.stats.max_batch}))
        pc.close()


if __name__ == "__main__":
    main()
