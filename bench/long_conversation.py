"""A conversation that grows to ~32K tokens at n_ctx 32768: each turn's first token, and the tokens it computed.

One PromptCache (one prompt slot, --threads, n_ctx 32768, a disk tier in a temp directory). Each
user turn pastes ~--turn-tokens tokens of NQ-open gold paragraphs (read in place from
$PC_CPU_EVALDATA, default ../shared/evaldata) and asks about them; the answer is greedy, at most
--answer-tokens tokens; between turns the cache is idle (a user reading: the answer's cells are
repaired and the tip stored). Reported per turn: TTFT, tokens computed and cached. With
--full-prefill, the last turn again as a full prefill of the same tokens (use_cache=False), once:
the ratio at ~32K (as long again as the whole conversation on 2 threads).

    python bench/long_conversation.py [--model qwen2.5-coder-0.5b] [--threads 2] [--turn-tokens 2500]
        [--turns 12] [--answer-tokens 16] [--full-prefill] [--out bench/results/long_conversation_<model>.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

from pc_cpu import PromptCache

sys.path.insert(0, str(Path(__file__).parent))
from long_document import N_CTX, rss_mib  # noqa: E402  (the same context and RSS reading)
from report_file import new_report, write_report  # noqa: E402
from several_servers import EVALDATA  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


def paragraphs():
    """Yields NQ-open gold paragraphs (title: text), in file order."""
    with gzip.open(EVALDATA / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            ctx = json.loads(line)["ctxs"][0]
            yield f"{ctx['title']}: {ctx['text']}"


def turns(count: int, turn_tokens: int, tokenize) -> list[str]:
    """Returns `count` user messages, each ~turn_tokens tokens of paragraphs and a question about them."""
    source, out = paragraphs(), []
    for _ in range(count):
        notes, size = [], 0
        while size < turn_tokens:
            note = next(source)
            notes.append(note)
            size += len(tokenize(note))
        out.append("More notes:\n\n" + "\n\n".join(notes) + "\n\nWhich title comes first in these notes?")
    return out


def run(model: str, threads: int, turn_tokens: int, count: int, answer_tokens: int, full_prefill: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="pc_cpu_long_chat_") as tmp, \
            PromptCache(model, threads=threads, n_ctx=N_CTX, parallel=1, store=Path(tmp)) as cache:
        messages, rows = [{"role": "system", "content": SYSTEM}], []
        for turn, text in enumerate(turns(count, turn_tokens, lambda t: cache.model.tokenize(t, special=False))):
            messages.append({"role": "user", "content": text})
            result = cache.chat(messages, max_tokens=answer_tokens, temperature=0.0)
            messages.append({"role": "assistant", "content": result.text})
            cache.wait_idle()
            rows.append({"turn": turn + 1, "ttft_ms": round(result.ttft_ms, 1), "computed": result.uncached_tokens,
                         "cached": result.cached_tokens, "answer": result.text})
            print(rows[-1], file=sys.stderr, flush=True)
        out = {"model": cache.model.path.name, "threads": threads, "n_ctx": cache.n_ctx, "parallel": 1,
               "flash_attn": cache.flash_attn, "turns": rows, "rss_mib_end": rss_mib(),
               "last_turn_prompt_tokens": rows[-1]["computed"] + rows[-1]["cached"]}
        if full_prefill:
            full = cache.chat(messages[:-1], max_tokens=answer_tokens, temperature=0.0, use_cache=False)
            out.update(last_turn_full_prefill_ms=round(full.ttft_ms, 1),
                       last_turn_speedup=round(full.ttft_ms / rows[-1]["ttft_ms"], 1),
                       last_turn_same_answer=full.text == rows[-1]["answer"])
        return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turn-tokens", type=int, default=2500)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--full-prefill", action="store_true", help="time the last turn's full prefill too")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = new_report("long_conversation.py", argv)
    report["result"] = result = run(args.model, args.threads, args.turn_tokens, args.turns, args.answer_tokens,
                                    args.full_prefill)
    print({k: v for k, v in result.items() if k != "turns"}, flush=True)
    write_report(report, args.out or Path(__file__).parent / "results" / f"long_conversation_{args.model}.json", [])


if __name__ == "__main__":
    main()
