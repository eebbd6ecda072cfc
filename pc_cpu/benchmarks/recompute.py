"""Sweep of recompute policies: exact match, agreement and TTFT against the full prefill, paired.

Every question is answered once by a full prefill (the baseline) and once per
policy from the same encoded modules (NaturalQuestions, N passages, one module
each, preamble encoding), so each difference is paired on identical tokens.

    python -m pc_cpu.benchmarks.recompute --count 100 --docs 5 [--policies 0 5% 20% tail:32 all] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from pc_cpu.benchmarks import prompts
from pc_cpu.benchmarks.evaldata import doc_items, load_nq
from pc_cpu.benchmarks.intervals import paired_difference, wilson
from pc_cpu.benchmarks.scoring import best_subspan_em
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.plan import CopyCells

DEFAULT_POLICIES = ("0", "2%", "5%", "10%", "20%", "35%", "head:8", "tail:32", "head:8,tail:32", "all")


@dataclass(frozen=True)
class Answer:
    """One question answered under one policy ("baseline" is the full prefill)."""

    index: int
    policy: str
    em: bool
    same_as_baseline: bool
    ttft_ms: float
    recomputed_share: float  # of the module tokens, computed again for this prompt


def answer_item(cache, item, policies, *, n_docs: int, chat: bool, max_tokens: int) -> list[Answer]:
    """Returns the baseline's and every policy's answer to one question, from one encoding of its passages."""
    name = f"rq{item.index}"
    schema = prompts.qa_schema(name, item, "modular", chat=chat)
    prompt = prompts.qa_prompt(name, item, "modular", chat=chat)
    cache.load_schema(schema)
    try:
        base = cache.generate(prompt, max_tokens=max_tokens, use_cache=False)
        module_tokens = _module_tokens(cache.plan(prompt))
        out = [Answer(item.index, "baseline", best_subspan_em(base.text, item.answers), True, base.ttft_ms, 1.0)]
        for policy in policies:
            plan = cache.plan(prompt, recompute=policy)
            result = cache.generate(prompt, max_tokens=max_tokens, recompute=policy)
            share = 1 - _module_tokens(plan) / module_tokens if module_tokens else 0.0
            out.append(Answer(item.index, policy, best_subspan_em(result.text, item.answers),
                              result.token_ids == base.token_ids, result.ttft_ms, share))
    finally:
        cache.unload_schema(name)
    return out


def _module_tokens(plan) -> int:
    """Returns the tokens the plan shares from modules (the schema's preamble is never recomputed)."""
    return sum(len(op.tokens) for op in plan.ops if isinstance(op, CopyCells) and op.module != ROOT)


def summarize(answers: list[Answer], policies) -> list[dict]:
    """Returns one row per policy: EM with its interval, paired difference to the baseline, agreement, TTFT."""
    by_policy = {p: sorted((a for a in answers if a.policy == p), key=lambda a: a.index)
                 for p in ("baseline", *policies)}
    base = by_policy["baseline"]
    base_ttft = statistics.median(a.ttft_ms for a in base)
    rows = []
    for policy in ("baseline", *policies):
        got = by_policy[policy]
        em = wilson(sum(a.em for a in got), len(got))
        diff = paired_difference([a.em for a in got], [a.em for a in base])
        agree = wilson(sum(a.same_as_baseline for a in got), len(got))
        ttft = statistics.median(a.ttft_ms for a in got)
        rows.append({"policy": policy, "n": len(got), "em": em.pct(), "diff_pts": diff.pts(),
                     "agreement": agree.pct(), "recomputed": f"{statistics.mean(a.recomputed_share for a in got):.0%}",
                     "ttft_ms": round(ttft, 1), "ttft_speedup": round(base_ttft / ttft, 1)})
    return rows


def markdown(rows: list[dict]) -> str:
    """Returns the rows as a Markdown table."""
    head = "| policy | n | exact match | vs full prefill (pts) | agreement | recomputed | TTFT ms | speedup |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['n']} | {r['em']} | {r['diff_pts']} | {r['agreement']} | "
                     f"{r['recomputed']} | {r['ttft_ms']} | {r['ttft_speedup']}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--plain", action="store_true", help="no chat template (base models)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", default=None, help="write every answer as a JSON line here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from pc_cpu import PromptCache

    items = doc_items(load_nq(), args.docs, args.count, seed=0)
    answers: list[Answer] = []
    out = open(args.out, "w") if args.out else None
    with PromptCache(args.model, threads=args.threads, n_ctx=8192, store=False) as cache:
        for i, item in enumerate(items):
            got = answer_item(cache, item, args.policies, n_docs=args.docs, chat=not args.plain,
                              max_tokens=args.max_tokens)
            answers += got
            if out:
                out.writelines(json.dumps(asdict(a)) + "\n" for a in got)
                out.flush()
            print(f"{i + 1}/{len(items)}", end="\r", flush=True)
    rows = summarize(answers, args.policies)
    print(json.dumps(rows) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
