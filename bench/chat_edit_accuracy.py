"""Answers after an edited message: after_edit="reuse" (the later turns' cells moved) against a full prefill.

Each item is a conversation of 12 messages: a system message, five user turns that each share one
NQ-open gold passage (read in place from $PC_CPU_EVALDATA, default ../shared/evaldata) with the
assistant's "Noted." after each, and a last user message asking the NQ question of one passage
shared after the edit (passage 3, 4 or 5 in turn). The edit replaces messages[3], the 2nd user
message (passage 2), with another question's passage: the turns after it, the asked passage
among them, were computed after the old passage.

Per item, on one PromptCache (same model, threads and context for every system):
1. "full prefill": the edited conversation with use_cache=False (nothing kept, nothing reused);
2. the original conversation, cached, then wait_idle() (its answer repaired and stored, as
   between a user's turns): the stream an edit finds;
3. "reuse": the edited conversation with after_edit="reuse".
The default, after_edit="recompute", computes everything after the edit as the full prefill does
and answers token for token as it (tests/engine/test_chat.py); bench/chat_turns.py times it.

Scores: best_subspan_em of each answer (greedy, --answer-tokens), the paired difference with a
bootstrap interval, how many answers are token-identical to the full prefill's, and TTFT
(median ratio full / reuse). Items use NQ lines of one parity (--lines odd|even), 6 lines each.

    python bench/chat_edit_accuracy.py --model qwen2.5-coder-0.5b --threads 2 --n 100 --lines odd \
        [--answer-tokens 24] [--out bench/results/chat_edit_qwen05.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from pc_cpu import PromptCache
from pc_cpu.benchmarks.evaldata import NQQuestion, load_nq
from pc_cpu.benchmarks.intervals import paired_difference, wilson
from pc_cpu.benchmarks.scoring import best_subspan_em

REPO = Path(__file__).resolve().parents[1]
SYSTEM = "You are a helpful assistant. The user shares passages, then asks a question about one of them. Answer briefly."
EDITED_INDEX = 3  # messages[3]: the 2nd user message (messages[0] is the system message)
PASSAGES = 5


def passage_message(number: int, q: NQQuestion) -> dict:
    return {"role": "user", "content": f"Passage {number} ({q.gold.title}):\n{q.gold.text}"}


def conversations(block: list[NQQuestion], item: int) -> tuple[list[dict], list[dict], NQQuestion, int]:
    """Returns the original and the edited messages of one item, the question asked, and its passage's number."""
    shared, substitute = block[:PASSAGES], block[PASSAGES]
    asked = 3 + item % 3  # a passage after the edited one
    messages = [{"role": "system", "content": SYSTEM}]
    for number, q in enumerate(shared, 1):
        messages += [passage_message(number, q), {"role": "assistant", "content": "Noted."}]
    question = shared[asked - 1]
    messages.append({"role": "user", "content": f"About passage {asked}: {question.question}?"})
    edited = [dict(m) for m in messages]
    edited[EDITED_INDEX] = passage_message(2, substitute)
    return messages, edited, question, asked


def item_blocks(questions: list[NQQuestion], parity: str, n: int) -> list[list[NQQuestion]]:
    """Returns `n` blocks of 6 questions from the NQ lines of `parity` (line 1 is the file's first), in file order."""
    lines = questions[0::2] if parity == "odd" else questions[1::2]
    size = PASSAGES + 1
    if n * size > len(lines):
        raise SystemExit(f"--n {n} needs {n * size} {parity} NQ lines; the file has {len(lines)}")
    return [lines[i * size:(i + 1) * size] for i in range(n)]


def run(pc: PromptCache, blocks: list[list[NQQuestion]], answer_tokens: int) -> list[dict]:
    records = []
    for item, block in enumerate(blocks):
        original, edited, question, asked = conversations(block, item)
        full = pc.chat(edited, max_tokens=answer_tokens, use_cache=False)
        pc.chat(original, max_tokens=answer_tokens)
        pc.wait_idle()
        reuse = pc.chat(edited, max_tokens=answer_tokens, after_edit="reuse")
        pc.wait_idle()  # the repair runs here, outside every TTFT
        record = {"item": item, "asked_passage": asked, "prompt_tokens": full.prompt_tokens,
                  "reuse_cached_tokens": reuse.cached_tokens, "reuse_computed_tokens": reuse.uncached_tokens,
                  "full_ttft_ms": round(full.ttft_ms, 1), "reuse_ttft_ms": round(reuse.ttft_ms, 1),
                  "full_correct": best_subspan_em(full.text, question.answers),
                  "reuse_correct": best_subspan_em(reuse.text, question.answers),
                  "identical": reuse.token_ids == full.token_ids}
        records.append(record)
        print(f"[{item + 1}/{len(blocks)}] full {int(record['full_correct'])} reuse {int(record['reuse_correct'])} "
              f"same {int(record['identical'])} | {record['full_ttft_ms']:.0f} / {record['reuse_ttft_ms']:.0f} ms "
              f"| {reuse.cached_tokens} moved or kept, {reuse.uncached_tokens} computed", file=sys.stderr, flush=True)
    return records


def summary(records: list[dict]) -> dict:
    n = len(records)
    full = [int(r["full_correct"]) for r in records]
    reuse = [int(r["reuse_correct"]) for r in records]
    return {
        "n": n,
        "full_prefill_accuracy": wilson(sum(full), n).pct(),
        "reuse_accuracy": wilson(sum(reuse), n).pct(),
        "reuse_minus_full_points": paired_difference(reuse, full).pts(),
        "identical_answers": f"{sum(r['identical'] for r in records)}/{n}",
        "median_prompt_tokens": statistics.median(r["prompt_tokens"] for r in records),
        "median_computed_tokens_reuse": statistics.median(r["reuse_computed_tokens"] for r in records),
        "median_ttft_ms": {"full prefill": statistics.median(r["full_ttft_ms"] for r in records),
                           "reuse": statistics.median(r["reuse_ttft_ms"] for r in records)},
        "median_speedup": round(statistics.median(r["full_ttft_ms"] / r["reuse_ttft_ms"] for r in records), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--lines", choices=("odd", "even"), default="odd")
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    blocks = item_blocks(load_nq(), args.lines, args.n)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()  # the code that runs, not what is committed meanwhile
    pc = PromptCache(args.model, n_ctx=4096, threads=args.threads, store=False, parallel=2)
    try:
        records = run(pc, blocks, args.answer_tokens)
    finally:
        pc.close()
    report = {"date": datetime.date.today().isoformat(), "commit": commit,
              "command": "python bench/chat_edit_accuracy.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads",
              "model": args.model, "summary": summary(records), "items": records}
    print(json.dumps(report["summary"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
