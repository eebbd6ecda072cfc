"""Does a prompt pay for modules it does not use? Decode time and TTFT against the resident library's size.

A schema of 100 passage modules (~60 tokens each) is loaded; before each measurement, exactly
N of them are resident (N = 1, 10, 40, 100; the rest evicted). A prompt that imports one of the
resident passages then generates 32 tokens, greedy (its cells moved from the library into its
stream: the prompt streams kept for reuse are emptied first). Reported per N: median TTFT and median
per-token decode time over --repeat runs, and their ratio to N = 1. Same model, threads, context
and tokens throughout, one process.

    python bench/resident.py [--model smollm2-135m] [--threads 2] [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from pc_cpu import PromptCache
from pc_cpu.benchmarks.evaldata import load_nq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    passages = [q.gold for q in load_nq()[:100]]
    modules = "".join(f'<module name="p{i}">{_escape(" ".join(p.text.split()[:45]))}</module>'
                      for i, p in enumerate(passages))
    schema = f'<schema name="lib"><system>Answer from the passage.</system><user>{modules}</user></schema>'
    prompt = '<prompt schema="lib"><p0/><user>What is this passage about?</user></prompt>'
    rows = []
    with PromptCache(args.model, threads=args.threads, n_seq_max=16, store=False) as pc:
        pc.load_schema(schema)
        for n in (1, 10, 40, 100):
            ttft, per_token = [], []
            for _ in range(args.repeat):
                pc.evict()
                pc.generate(_import_all(n), max_tokens=1)  # makes p0..p{n-1} resident
                cells = pc.schemas.resident_cells
                pc.workbench.scheduler.drop_held()  # measure the restore into a stream, not a kept stream's reuse
                r = pc.generate(prompt, max_tokens=32)
                ttft.append(r.ttft_ms)
                per_token.append((r.total_ms - r.ttft_ms) / max(1, len(r.token_ids) - 1))
            rows.append({"resident_modules": n, "resident_cells": cells, "ttft_ms": statistics.median(ttft),
                         "decode_ms_per_token": statistics.median(per_token)})
    base = rows[0]
    for row in rows:
        row["ttft_vs_1"] = row["ttft_ms"] / base["ttft_ms"]
        row["decode_vs_1"] = row["decode_ms_per_token"] / base["decode_ms_per_token"]
    if args.json:
        print(json.dumps({"model": args.model, "threads": args.threads, "repeat": args.repeat, "rows": rows}))
    else:
        print("| resident modules | cells | TTFT ms | decode ms/token | TTFT vs 1 | decode vs 1 |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['resident_modules']} | {r['resident_cells']} | {r['ttft_ms']:.1f} | "
                  f"{r['decode_ms_per_token']:.2f} | {r['ttft_vs_1']:.2f} | {r['decode_vs_1']:.2f} |")


def _import_all(n: int) -> str:
    imports = "".join(f"<p{i}/>" for i in range(n))
    return f'<prompt schema="lib">{imports}<user>Hi</user></prompt>'


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


if __name__ == "__main__":
    main()
