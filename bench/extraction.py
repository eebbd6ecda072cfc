"""Structured output on extraction items: valid JSON, field accuracy cached vs full prefill, the grammar's cost per token.

Items (issue 54, "Measure"): NQ-open records read in place from $PC_CPU_EVALDATA (default
../shared/evaldata; MIT, NaturalQuestions CC BY-SA, see its SOURCES.md), the first --items. Each
is a passage (a Wikipedia paragraph) and a question; the answer is JSON held to SCHEMA:
- "topic": what the passage is about; right when it and the passage's Wikipedia title contain one
  another (normalised as the NQ scorer does);
- "answer": the answer to the question; right when a gold answer is in it (best_subspan_em);
- "mentions_year": whether the passage has a year (1000-2099) in it; right when it agrees with a regex.

How it runs, as an extraction app over pc_cpu would: one system message (the instructions and the
schema's fields, ~180 tokens, the same for every item), each passage added as a document for it
(PromptCache.add_document) and one question over it (PromptCache.ask, response_format json_schema,
greedy, --max-tokens): "cached" (the system message's and the passage's cells restored, only the
question computed) and "full prefill" (use_cache=False: the same tokens computed whole). Field
accuracy of each, how often their JSON is the same, and the fraction that parses and validates.

Grammar cost: on the first --cost-items items, the cached question asked again without the
grammar (free text); the decode time per token after the first ((total - TTFT) / (tokens - 1)),
median over items, with and without; the difference is what the grammar sampler costs a token.

    python bench/extraction.py [--model qwen2.5-coder-0.5b] [--items 200] [--cost-items 50] [--threads 2]
        [--out bench/results/extraction.json] [--quick]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from pc_cpu import PromptCache
from pc_cpu.benchmarks.scoring import best_subspan_em, normalize_answer

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402  (bench scripts share these helpers)

REPO = Path(__file__).resolve().parent.parent
EVALDATA = Path(os.environ.get("PC_CPU_EVALDATA", REPO.parent / "shared" / "evaldata"))
SCHEMA = {"type": "object", "properties": {
    "topic": {"type": "string", "maxLength": 60},
    "answer": {"type": "string", "maxLength": 60},
    "mentions_year": {"type": "boolean"}}, "required": ["topic", "answer", "mentions_year"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "extraction", "schema": SCHEMA, "strict": True}}
SYSTEM = """You extract facts from a passage into JSON. Read the passage and the question, then answer with one JSON
object and nothing else, with exactly these fields:
- "topic": the subject of the passage, as the title of its encyclopedia article would name it (a few words);
- "answer": the answer to the question, copied from the passage (a short phrase, not a sentence);
- "mentions_year": true if the passage mentions a calendar year (such as 1987), else false.
Use the passage only. If the passage does not answer the question, give your best short guess."""
YEAR = re.compile(r"\b(1\d{3}|20\d{2})\b")


def items(n: int) -> list[dict]:
    """Returns the first `n` NQ-open records as {question, answers, title, passage}."""
    out = []
    with gzip.open(EVALDATA / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            ctx = record["ctxs"][0]
            out.append({"question": record["question"], "answers": record["answers"], "title": ctx["title"],
                        "passage": ctx["text"]})
            if len(out) == n:
                break
    return out


def valid(text: str) -> dict | None:
    """Returns the answer's object when it parses and SCHEMA admits it, else None."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or set(value) != set(SCHEMA["required"]):
        return None
    if not (isinstance(value["topic"], str) and isinstance(value["answer"], str)
            and isinstance(value["mentions_year"], bool)):
        return None
    if len(value["topic"]) > 60 or len(value["answer"]) > 60:
        return None
    return value


def scores(value: dict | None, item: dict) -> dict:
    """Returns whether each field is right (all False for an answer that is not valid)."""
    if value is None:
        return {"topic": False, "answer": False, "mentions_year": False}
    topic, title = normalize_answer(value["topic"]), normalize_answer(item["title"])
    return {"topic": bool(topic) and (topic in title or title in topic),
            "answer": best_subspan_em(value["answer"], item["answers"]),
            "mentions_year": value["mentions_year"] == bool(YEAR.search(item["passage"]))}


def per_token_ms(result) -> float | None:
    n = len(result.token_ids)
    return (result.total_ms - result.ttft_ms) / (n - 1) if n > 1 else None


def run(model: str, args) -> dict:
    store = Path(tempfile.mkdtemp(prefix="pc_cpu_extraction_"))
    pc = PromptCache(model, threads=args.threads, store=store)
    data = items(args.items)
    rows, cost = [], {"grammar": [], "free": []}
    try:
        for i, item in enumerate(data):
            doc = pc.add_document(item["passage"], system=SYSTEM)
            question = f"Question: {item['question']}\nAnswer with the JSON object."
            ask = dict(documents=[doc], system=SYSTEM, response_format=FORMAT, max_tokens=args.max_tokens)
            cached = pc.ask(question, **ask)
            full = pc.ask(question, use_cache=False, **ask)
            row = {"index": i, "cached_tokens": cached.cached_tokens, "computed_tokens": cached.uncached_tokens,
                   "prompt_tokens": full.prompt_tokens, "ttft_ms": {"cached": round(cached.ttft_ms, 1),
                                                                   "full prefill": round(full.ttft_ms, 1)}}
            for name, result in (("cached", cached), ("full prefill", full)):
                value = valid(result.text)
                row[name] = {"valid": value is not None, "finish_reason": result.finish_reason,
                             "scores": scores(value, item), "tokens": len(result.token_ids)}
                if args.keep_text:
                    row[name]["text"] = result.text
            row["same_json"] = cached.text == full.text
            if i < args.cost_items:
                free = pc.ask(question, documents=[doc], system=SYSTEM, max_tokens=len(cached.token_ids))
                cost["grammar"].append(per_token_ms(cached))
                cost["free"].append(per_token_ms(free))
            rows.append(row)
            if (i + 1) % 20 == 0:
                print(f"{model}: {i + 1}/{len(data)}", file=sys.stderr, flush=True)
    finally:
        pc.close()
    summary = {}
    for name in ("cached", "full prefill"):
        summary[name] = {"valid_json": sum(r[name]["valid"] for r in rows) / len(rows),
                         **{f"{field}_accuracy": sum(r[name]["scores"][field] for r in rows) / len(rows)
                            for field in ("topic", "answer", "mentions_year")},
                         "median_ttft_ms": statistics.median(r["ttft_ms"][name] for r in rows)}
    grammar = [x for x in cost["grammar"] if x is not None]
    free = [x for x in cost["free"] if x is not None]
    summary["same_json_cached_vs_full"] = sum(r["same_json"] for r in rows) / len(rows)
    summary["ttft_full_over_cached"] = statistics.median(r["ttft_ms"]["full prefill"] / r["ttft_ms"]["cached"]
                                                        for r in rows)
    summary["per_token_ms"] = {"grammar": statistics.median(grammar) if grammar else None,
                               "free": statistics.median(free) if free else None, "items": len(grammar)}
    return {"items": len(rows), "summary": summary, "rows": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--cost-items", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-text", action="store_true", help="write the answers too (not into the repository)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/extraction.json")
    parser.add_argument("--quick", action="store_true", help="10 items, 5 for the grammar's cost")
    args = parser.parse_args(argv)
    if args.quick:
        args.items, args.cost_items = 10, 5
    report = new_report("extraction.py", argv)
    missed = []
    for model in args.model or ["qwen2.5-coder-0.5b"]:
        entry = run(model, args)
        report["models"][model] = entry
        s = entry["summary"]
        print(json.dumps({model: s}, indent=1), flush=True)
        missed += [f"{model} {name}: {s[name]['valid_json']:.1%} valid JSON" for name in ("cached", "full prefill")
                   if s[name]["valid_json"] < 1]
    write_report(report, args.out, missed)


if __name__ == "__main__":
    main()
