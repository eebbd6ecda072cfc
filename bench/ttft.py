"""TTFT of a cached prompt against a full prefill of the same tokens (issue: foundation benchmark).

A schema of ~4,000 tokens of document modules; a prompt imports all of them and
asks a short question. Both runs go through the same PromptCache (same model,
context, threads and tokens) and alternate, so machine noise hits both; the
report gives medians and their ratio.

    python bench/ttft.py --threads 2 --repeats 5 [--tokens 4000] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pc_cpu import PromptCache
from pc_cpu.demo import DOCS


def document_modules(pc: PromptCache, target_tokens: int) -> list[tuple[str, str]]:
    """Returns (name, text) modules, rotations of the demo documents, adding up to ~target_tokens."""
    texts = list(DOCS.values())
    modules, total, i = [], 0, 0
    while total < target_tokens:
        text = " ".join(texts[(i + k) % len(texts)] for k in range(len(texts)))
        modules.append((f"part{i}", text))
        total += len(pc.model.tokenize(text, special=False))
        i += 1
    return modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plain", action="store_true",
                        help="no chat roles: fewer computed tokens (no template markup around the question)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    # Cells for the resident modules plus a full-prefill baseline of the same tokens.
    pc = PromptCache(args.model, threads=args.threads, n_ctx=2 * args.tokens + 2048)
    modules = document_modules(pc, args.tokens)
    body = "".join(f'<module name="{n}">{t}</module>' for n, t in modules)
    if args.plain:
        schema = f'<schema name="bench">Answer from the documents. {body}</schema>'
    else:
        schema = f'<schema name="bench"><system>Answer from the documents.</system><user>{body}</user></schema>'
    t0 = time.perf_counter()
    pc.load_schema(schema)
    encode_s = time.perf_counter() - t0
    imports = "".join(f"<{n}/>" for n, _ in modules)
    question = "When was the Calder Light automated?"
    if args.plain:
        prompt = f'<prompt schema="bench">{imports} Q: {question} A:</prompt>'
    else:
        prompt = f'<prompt schema="bench">{imports}<user>{question}</user></prompt>'

    pc.generate(prompt, max_tokens=1)  # warm-up: first-call allocations
    cached, baseline = [], []
    for _ in range(args.repeats):
        cached.append(pc.generate(prompt, max_tokens=1).ttft_ms)
        baseline.append(pc.generate(prompt, max_tokens=1, use_cache=False).ttft_ms)
    plan = pc.plan(prompt)
    report = {
        "model": pc.model.info.description, "threads": pc.ctx.threads, "repeats": args.repeats,
        "cached_tokens": plan.cached_tokens, "uncached_tokens": plan.uncached_tokens,
        "encode_s": round(encode_s, 2),
        "ttft_cached_ms_median": round(statistics.median(cached), 1),
        "ttft_baseline_ms_median": round(statistics.median(baseline), 1),
        "speedup_median": round(statistics.median(baseline) / statistics.median(cached), 1),
        "ttft_cached_ms": [round(x, 1) for x in cached], "ttft_baseline_ms": [round(x, 1) for x in baseline],
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value}")
    pc.close()


if __name__ == "__main__":
    main()
