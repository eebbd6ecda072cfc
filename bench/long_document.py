"""A ~30,000-token document at n_ctx 32768: what it costs once, and what a question over it costs from each tier.

One PromptCache (one prompt slot, --threads, n_ctx 32768, a RAM tier of 2 GiB so that the
1.5B's ~0.9 GB of cells fit, a disk tier in a temp directory) on NQ-open gold paragraphs read in
place from $PC_CPU_EVALDATA (default ../shared/evaldata) up to --doc-tokens tokens:

- "add": add_document, the first time (the document's cells computed and written to RAM and disk);
- "full prefill": the question over the document, use_cache=False (the same tokens, computed);
- "resident": the question again, the slot's stream holding the document (only the question computed);
- "ram": the context emptied (evict), the cells restored from the RAM tier;
- "disk": the RAM tier emptied and the page cache dropped, the cells read from disk.

Every question is prefix="off" (the document's own cells: at its home, so not moved). The full
prefill runs once (minutes on 2 threads) and answers --answer-tokens tokens; the resident question
answers as many, and the report says whether the two answers are the same. Also reported: the bytes
stored and the process's RSS (now and its peak, /proc/self/status).

    python bench/long_document.py [--model qwen2.5-coder-1.5b] [--threads 2] [--doc-tokens 30000]
        [--repeats 3] [--answer-tokens 16] [--out bench/results/long_document_<model>.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pc_cpu import PromptCache

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402  (bench scripts share these helpers)
from several_servers import SYSTEM, manual  # noqa: E402  (the same NQ paragraphs, read in place)
from pc_cpu.benchmarks.latency import drop_page_cache  # noqa: E402

QUESTION = "Which title comes first in the manual?"
N_CTX = 32768
RAM_BYTES = 2 << 30
# Goals (issue 56): on the 1.5B, a cached question's first token within these, the full prefill taking minutes.
RESIDENT_GOAL_MS, DISK_GOAL_MS = 1000.0, 2000.0


def rss_mib() -> dict[str, float]:
    """Returns this process's resident set now (VmRSS) and at its peak (VmHWM), in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"now": fields.get("VmRSS"), "peak": fields.get("VmHWM")}


def ask(cache: PromptCache, *, max_tokens: int = 1, use_cache: bool = True):
    return cache.ask(QUESTION, documents=["manual"], system=SYSTEM, prefix="off", max_tokens=max_tokens,
                     use_cache=use_cache, temperature=0.0)


def empty_ram(cache: PromptCache) -> None:
    ram = cache.store.tier("ram")
    for key in list(ram.keys()):
        ram.remove(key)


def measure(model: str, threads: int, doc_tokens: int, repeats: int, answer_tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="pc_cpu_long_") as tmp:
        store = Path(tmp)
        with PromptCache(model, threads=threads, n_ctx=N_CTX, parallel=1, store=store, ram_bytes=RAM_BYTES) as cache:
            text = manual(doc_tokens, lambda t: cache.model.tokenize(t, special=False))
            rss_loaded = rss_mib()
            t0 = time.perf_counter()
            cache.add_document(text, name="manual", system=SYSTEM)
            add_s = time.perf_counter() - t0
            cache.wait_idle()
            print(f"added in {add_s:.1f} s", file=sys.stderr, flush=True)
            full = ask(cache, max_tokens=answer_tokens, use_cache=False)
            print(f"full prefill {full.ttft_ms / 1000:.1f} s", file=sys.stderr, flush=True)
            cached = ask(cache, max_tokens=answer_tokens)  # restores the document; its answer against the full prefill's
            times: dict[str, list[float]] = {"resident": [], "ram": [], "disk": []}
            tiers = {}
            for _ in range(repeats):
                result = ask(cache)  # the slot's stream holds the document: only the question is computed
                times["resident"].append(result.ttft_ms)
                tiers["resident"] = sorted(set(map(str, result.tiers.values())))
                cache.evict()
                result = ask(cache)
                times["ram"].append(result.ttft_ms)
                tiers["ram"] = sorted(set(map(str, result.tiers.values())))
                cache.evict()
                empty_ram(cache)
                drop_page_cache(store)
                result = ask(cache)
                times["disk"].append(result.ttft_ms)
                tiers["disk"] = sorted(set(map(str, result.tiers.values())))
            p50 = {name: statistics.median(values) for name, values in times.items()}
            return {
                "model": cache.model.path.name, "threads": threads, "n_ctx": cache.n_ctx, "parallel": 1,
                "flash_attn": cache.flash_attn, "document_tokens": len(cache.documents.tokens(text)),
                "question_tokens": cached.uncached_tokens,
                "prompt_tokens": full.prompt_tokens,
                "add_s": round(add_s, 1), "full_prefill_ms": round(full.ttft_ms, 1),
                "ttft_ms_p50": {k: round(v, 1) for k, v in p50.items()}, "ttft_ms": times, "tiers": tiers,
                "speedup": {k: round(full.ttft_ms / v, 1) for k, v in p50.items()},
                "same_answer": cached.token_ids == full.token_ids,
                "answers": {"full prefill": full.text, "cached": cached.text},
                "store_bytes": sum(p.stat().st_size for p in store.rglob("*") if p.is_file()),
                "rss_mib": {"model_loaded": rss_loaded, "end": rss_mib()},
            }


def goals(result: dict) -> list[str]:
    if "1.5b" not in result["model"].lower():
        return []
    p50, missed = result["ttft_ms_p50"], []
    if p50["resident"] >= RESIDENT_GOAL_MS:
        missed.append(f"resident {p50['resident']:.0f} ms >= {RESIDENT_GOAL_MS:.0f} ms")
    if p50["disk"] >= DISK_GOAL_MS:
        missed.append(f"disk {p50['disk']:.0f} ms >= {DISK_GOAL_MS:.0f} ms")
    return missed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--doc-tokens", type=int, default=30000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = new_report("long_document.py", argv)
    result = measure(args.model, args.threads, args.doc_tokens, args.repeats, args.answer_tokens)
    report["result"] = result
    print({k: v for k, v in result.items() if k not in ("ttft_ms", "answers")}, flush=True)
    out = args.out or Path(__file__).parent / "results" / f"long_document_{args.model}.json"
    write_report(report, out, goals(result))


if __name__ == "__main__":
    main()
