"""Where a question over documents spends its TTFT: llama.cpp's decode calls, state reads and writes, per policy.

    python bench/document_ttft_parts.py --model qwen2.5-coder-0.5b --threads 1 --n 6 --policy 0 --policy relevant:1

Adds the documents of the first n even-line NQ items (after each item's system message, so that
questions restore them), then asks each item with each policy and with the full prefill, one answer
token, prefix="off", and prints every call's time, count and tokens. Each call of
pc_cpu.engine.llama.context.Context is wrapped with a timer here, not in the library: the bench alone pays for it.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

from pc_cpu import PromptCache
from pc_cpu.benchmarks.document_accuracy import questions
from pc_cpu.engine.llama.context import Context

CALLS = ("decode", "decode_each", "state_get", "state_set", "state_get_reusing", "seq_rm", "seq_cp", "seq_add")
seconds: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()
tokens: collections.Counter = collections.Counter()


def timed(name: str) -> None:
    """Replaces Context.<name> with a version that adds its time, calls and tokens to the counters."""
    original = getattr(Context, name)

    def call(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start
            calls[name] += 1
            if name.startswith("decode"):
                tokens[name] += len(args[0])

    setattr(Context, name, call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--policy", action="append", default=None)
    args = parser.parse_args()
    for name in CALLS:
        timed(name)
    items = questions("nq", "even", args.n, 5)
    with PromptCache(args.model, threads=args.threads) as pc:
        ids = {text: pc.add_document(text, system=item.system) for item in items for text in item.documents}
        pc.ask("warm up", documents=[], max_tokens=1)
        print("| path | question | TTFT (ms) | calls: ms / count / tokens |\n|---|---|---|---|")
        for policy in [*(args.policy or ["0", "relevant:1"]), "full prefill"]:
            ttfts = []
            for item in items:
                seconds.clear(), calls.clear(), tokens.clear()
                how = dict(use_cache=False) if policy == "full prefill" else dict(recompute=policy)
                result = pc.ask(item.question, documents=[ids[d] for d in item.documents], system=item.system,
                                max_tokens=1, prefix="off", **how)
                ttfts.append(result.ttft_ms)
                parts = ", ".join(f"{name} {seconds[name] * 1000:.0f}/{calls[name]}"
                                  + (f"/{tokens[name]}" if tokens[name] else "") for name in seconds)
                print(f"| {policy} | {item.index} | {result.ttft_ms:,.0f} | {parts} |", flush=True)
            print(f"| {policy} | median | {statistics.median(ttfts):,.0f} | |", flush=True)


if __name__ == "__main__":
    main()
