"""TTFT of a cached prompt, with its modules resident, in RAM or on disk, against a full prefill.

A schema of ~4,000 tokens of document modules; a prompt imports all of them and
asks a short question. Every run goes through one PromptCache (same model,
context, threads and tokens). The settings alternate within each repeat, so
machine noise hits all of them; the report gives medians and ratios to the
full prefill's median.

- resident: modules already in the context (tier 0);
- ram: evicted from the context before the run, restored from the RAM tier;
- disk: evicted from the context and RAM, files dropped from the page cache
  (posix_fadvise DONTNEED), restored from the disk tier.

    python bench/ttft.py --threads 2 --repeats 5 [--plain] [--tokens 4000] [--model PATH] [--flash-attn off] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pc_cpu import PromptCache
from pc_cpu.benchmarks.latency import drop_page_cache, open_cache
from pc_cpu.cli import FLASH_ATTN
from pc_cpu.engine.llama.context import default_threads
from pc_cpu.demo import DOCS

SETTINGS = ("resident", "ram", "disk", "full_prefill")


def document_modules(pc: PromptCache, target_tokens: int, texts_per_module: int = 0) -> list[tuple[str, str]]:
    """Returns (name, text) modules, rotations of the demo documents, adding up to ~target_tokens.

    Each module joins `texts_per_module` demo documents (0: all of them).
    """
    texts = list(DOCS.values())
    per_module = texts_per_module or len(texts)
    modules, total, i = [], 0, 0
    while total < target_tokens:
        text = " ".join(texts[(i + k) % len(texts)] for k in range(per_module))
        modules.append((f"part{i}", text))
        total += len(pc.model.tokenize(text, special=False))
        i += 1
    return modules


def schema_and_prompt(modules: list[tuple[str, str]], *, plain: bool) -> tuple[str, str]:
    """Returns the benchmark schema and prompt; `plain` leaves out chat markup (fewer computed tokens)."""
    body = "".join(f'<module name="{n}">{t}</module>' for n, t in modules)
    imports = "".join(f"<{n}/>" for n, _ in modules)
    question = "When was the Calder Light automated?"
    if plain:
        return (f'<schema name="bench">Answer from the documents. {body}</schema>',
                f'<prompt schema="bench">{imports} Q: {question} A:</prompt>')
    return (f'<schema name="bench"><system>Answer from the documents.</system><user>{body}</user></schema>',
            f'<prompt schema="bench">{imports}<user>{question}</user></prompt>')


def ttft(pc: PromptCache, prompt: str, setting: str, store_dir: Path) -> tuple[float, str]:
    """Returns (TTFT in ms, tiers that served the modules) for one run of `setting`."""
    if setting in ("ram", "disk"):
        pc.evict()
    if setting == "disk":
        ram = pc.store.tier("ram")
        for key in list(ram.keys()):
            ram.remove(key)
        drop_page_cache(store_dir)
    result = pc.generate(prompt, max_tokens=1, use_cache=setting != "full_prefill")
    return result.ttft_ms, ",".join(sorted(set(result.tiers.values()))) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help="no chat markup around the question")
    parser.add_argument("--flash-attn", choices=tuple(FLASH_ATTN), default="auto",
                        help="PromptCache(flash_attn=...): auto is pc_cpu's default (off, unless the model has a "
                             "sliding window: pc_cpu.engine.llama.context.default_flash_attn)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    store_dir = Path(tempfile.mkdtemp(prefix="pc_cpu_bench_store_"))
    # Cells for the resident modules plus a full-prefill baseline of the same tokens.
    # (at most the model's training context: PromptCache refuses more, and each prompt has a stream of its own)
    flash_attn = FLASH_ATTN[args.flash_attn]
    pc = open_cache(args.model, args.threads, 2 * args.tokens + 2048, store=store_dir, flash_attn=flash_attn)
    schema, prompt = schema_and_prompt(document_modules(pc, args.tokens), plain=args.plain)
    t0 = time.perf_counter()
    pc.load_schema(schema)
    encode_s = time.perf_counter() - t0
    pc.generate(prompt, max_tokens=1)  # warm-up: first-call allocations

    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    served: dict[str, str] = {}
    for _ in range(args.repeats):
        for setting in SETTINGS:
            ms, tiers = ttft(pc, prompt, setting, store_dir)
            times[setting].append(ms)
            served[setting] = tiers
    plan = pc.plan(prompt)
    base = statistics.median(times["full_prefill"])
    report = {
        "model": pc.model.path.name, "threads": args.threads or default_threads(), "repeats": args.repeats,
        "plain": args.plain, "flash_attn": args.flash_attn, "flash_attn_used": pc.flash_attn,
        "cached_tokens": plan.cached_tokens, "computed_tokens": plan.uncached_tokens,
        "encode_s": round(encode_s, 2),
        "store_mib": round(sum(p.stat().st_size for p in store_dir.glob("*.pcs")) / 2**20, 1),
    }
    for setting in SETTINGS:
        report[f"{setting}_ms_median"] = round(statistics.median(times[setting]), 1)
        report[f"{setting}_speedup"] = round(base / statistics.median(times[setting]), 1)
        report[f"{setting}_served_by"] = served[setting]
        report[f"{setting}_ms"] = [round(x, 1) for x in times[setting]]
    print(json.dumps(report) if args.json else "\n".join(f"{k:>24}: {v}" for k, v in report.items()))
    pc.close()


if __name__ == "__main__":
    main()
