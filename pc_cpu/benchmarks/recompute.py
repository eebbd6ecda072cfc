"""Sweep of recompute policies: exact match, agreement and TTFT against the full prefill, paired.

Every item is answered once by a full prefill (the baseline) and once per
policy from the same encoded modules (NaturalQuestions with N passages, or
key-value retrieval with N pairs; one module each, preamble encoding), so each
difference is paired on identical tokens.
The TTFT that matters for a policy is at long prompts, so `ttft_by_policy`
measures it apart, on ~4,000 cached tokens of documents.

    pc-cpu bench recompute run --n 200 --docs 5 [--policy 0 --policy 20% ...] --out answers.jsonl
    pc-cpu bench recompute run --task kv --docs 5 --n 200 --out kv.jsonl
    pc-cpu bench recompute summarize answers.jsonl [more.jsonl] [--ttft-json ttft.json] [--plot pareto.png]
    pc-cpu bench recompute compare chain.jsonl --versus preamble.jsonl
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

from pc_cpu.benchmarks import workloads
from pc_cpu.benchmarks.accuracy import Task, gap_fillers
from pc_cpu.benchmarks.timing import stats
from pc_cpu.benchmarks.intervals import paired_difference, wilson
from pc_cpu.benchmarks.scoring import best_subspan_em
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.plan import CopyCells

DEFAULT_POLICIES = ("0", "2%", "5%", "10%", "20%", "35%", "head:8", "tail:32", "select:10%", "select:20%", "all")


@dataclass(frozen=True)
class Answer:
    """One question answered under one policy ("baseline" is the full prefill)."""

    index: int
    policy: str
    em: bool
    same_as_baseline: bool
    ttft_ms: float
    recomputed_share: float  # of the module tokens, computed again for this prompt
    gold_index: int = -1  # where the gold passage is (-1: not recorded; such answers have no row by position)


def answer_item(cache, item, policies, *, task: Task, max_tokens: int, gap_passages: tuple = (),
                baseline=None) -> tuple[list[Answer], object]:
    """Returns the baseline's and every policy's answer to one item, and the full prefill's Result.

    All policies answer from one encoding of the item's modules. `gap_passages` are declared as
    modules before the item's passages and left out of the prompt. `baseline` is the item's
    full-prefill Result when another cache already computed it: the full prefill does not depend
    on the encoding, and it is most of an item's time.
    """
    name = f"rq{item.index}"
    schema = task.schema(name, item, "modular", tuple(gap_passages))
    prompt = task.prompt(name, item, "modular")
    answers = task.answers(item)
    cache.load_schema(schema)
    try:
        base = baseline or cache.generate(prompt, max_tokens=max_tokens, use_cache=False)
        module_tokens = _module_tokens(cache.plan(prompt))
        out = [Answer(item.index, "baseline", best_subspan_em(base.text, answers), True, base.ttft_ms, 1.0,
                      item.gold_index)]
        for policy in policies:
            plan = cache.plan(prompt, recompute=policy)
            result = cache.generate(prompt, max_tokens=max_tokens, recompute=policy)
            # Shared module cells the plan computes again, plus those the engine picks (select:).
            share = (1 - (_module_tokens(plan) - plan.selected_tokens) / module_tokens) if module_tokens else 0.0
            out.append(Answer(item.index, policy, best_subspan_em(result.text, answers),
                              result.token_ids == base.token_ids, result.ttft_ms, share, item.gold_index))
    finally:
        cache.unload_schema(name)
    return out, base


def read_answers(paths) -> list[Answer]:
    """Returns the answers of JSON-lines files from several runs; a (question, policy) seen twice counts once."""
    seen: dict[tuple[int, str], Answer] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    a = Answer(**json.loads(line))
                    seen.setdefault((a.index, a.policy), a)
    return list(seen.values())


def policies_in(answers: list[Answer]) -> list[str]:
    """Returns the policies the answers cover (not the baseline), in first-seen order."""
    return list(dict.fromkeys(a.policy for a in answers if a.policy != "baseline"))


def ttft_by_policy(cache, policies, *, target_tokens: int = 4000, repeats: int = 3) -> dict:
    """Returns TTFT p50 of the full prefill and of each policy on one ~target_tokens multi-document prompt.

    Runs alternate (baseline, then every policy) within each repeat, so machine noise hits all alike.
    """
    w = workloads.multidoc(lambda t: cache.model.tokenize(t, special=False), target_tokens, name="rcttft")
    cache.load_schema(w.schema)
    for policy in policies:  # untimed: the first select: run loads the probe model
        cache.generate(w.prompt, max_tokens=1, recompute=policy)
    times: dict[str, list[float]] = {"baseline": [], **{p: [] for p in policies}}
    for _ in range(repeats):
        times["baseline"].append(cache.generate(w.prompt, max_tokens=1, use_cache=False).ttft_ms)
        for policy in policies:
            times[policy].append(cache.generate(w.prompt, max_tokens=1, recompute=policy).ttft_ms)
    plan = cache.plan(w.prompt)
    cache.unload_schema("rcttft")
    base = stats(times["baseline"]).p50
    return {"cached_tokens": plan.cached_tokens, "uncached_tokens": plan.uncached_tokens, "repeats": repeats,
            "ttft_ms": {p: round(stats(t).p50, 1) for p, t in times.items()},
            "speedup": {p: round(base / stats(t).p50, 2) for p, t in times.items()}}


def _module_tokens(plan) -> int:
    """Returns the tokens the plan shares from modules (the schema's preamble is never recomputed)."""
    return sum(len(op.tokens) for op in plan.ops if isinstance(op, CopyCells) and op.module != ROOT)


def summarize(answers: list[Answer], policies, ttft: dict | None = None) -> list[dict]:
    """Returns one row per policy: EM with its interval, paired difference to the baseline, agreement, TTFT.

    Only questions answered under every policy count, so every row is paired on the same questions.
    `ttft` (from ttft_by_policy) adds each policy's speedup at long prompts.
    """
    wanted = ("baseline", *policies)
    by_index: dict[int, dict[str, Answer]] = {}
    for a in answers:
        by_index.setdefault(a.index, {})[a.policy] = a
    complete = sorted(i for i, got in by_index.items() if all(p in got for p in wanted))
    base = [by_index[i]["baseline"] for i in complete]
    base_ttft = statistics.median(a.ttft_ms for a in base) if base else 0.0
    rows = []
    for policy in wanted:
        got = [by_index[i][policy] for i in complete]
        if not got:
            continue
        em = wilson(sum(a.em for a in got), len(got))
        diff = paired_difference([a.em for a in got], [a.em for a in base])
        agree = wilson(sum(a.same_as_baseline for a in got), len(got))
        wins = sum(a.em and not b.em for a, b in zip(got, base))
        losses = sum(b.em and not a.em for a, b in zip(got, base))
        ttft_ms = statistics.median(a.ttft_ms for a in got)
        row = {"policy": policy, "n": len(got), "em": em.pct(), "diff_pts": diff.pts(), "wins_losses": f"{wins}/{losses}",
               "diff": [diff.estimate, diff.low, diff.high], "agreement": agree.pct(),
               "recomputed": f"{statistics.mean(a.recomputed_share for a in got):.0%}",
               "ttft_ms": round(ttft_ms, 1), "ttft_speedup": round(base_ttft / ttft_ms, 1)}
        if ttft:
            row["speedup_long"] = ttft["speedup"].get(policy)
        if "0" in policies and policy not in ("baseline", "0"):  # does recomputing beat not recomputing?
            none = [by_index[i]["0"].em for i in complete]
            row["vs_none_pts"] = paired_difference([a.em for a in got], none).pts()
        rows.append(row)
    return rows


def markdown(rows: list[dict], ttft: dict | None = None) -> str:
    """Returns the rows as a Markdown table."""
    long = f"speedup at {ttft['cached_tokens']:,} cached tok" if ttft else "speedup (these prompts)"
    head = (f"| policy | n | exact match | vs full prefill (pts) | +/− | vs recompute 0 (pts) | agreement | "
            f"recomputed | {long} |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = r.get("speedup_long") if ttft else r["ttft_speedup"]
        lines.append(f"| {r['policy']} | {r['n']} | {r['em']} | {r['diff_pts']} | {r['wins_losses']} | "
                     f"{r.get('vs_none_pts', '—')} | {r['agreement']} | {r['recomputed']} | "
                     f"{'—' if speed is None else f'{speed}×'} |")
    return "\n".join(lines)


def versus(answers: list[Answer], other: list[Answer], policies) -> list[dict]:
    """Returns, per policy (baseline included), this run's exact match minus another run's, paired by question.

    For two runs on the same questions that differ in one setting (e.g. the encoding):
    each run keeps its own full prefill, so this compares the policies' answers directly.
    """
    rows = []
    for policy in ("baseline", *policies):
        mine = {a.index: a.em for a in answers if a.policy == policy}
        theirs = {a.index: a.em for a in other if a.policy == policy}
        common = sorted(mine.keys() & theirs.keys())
        if not common:
            continue
        diff = paired_difference([mine[i] for i in common], [theirs[i] for i in common])
        wins = sum(mine[i] and not theirs[i] for i in common)
        losses = sum(theirs[i] and not mine[i] for i in common)
        rows.append({"policy": policy, "n": len(common), "diff_pts": diff.pts(), "wins_losses": f"{wins}/{losses}"})
    return rows


def versus_markdown(rows: list[dict]) -> str:
    """Returns the rows of `versus` as a Markdown table."""
    lines = ["| policy | n | this run − the other (pts) | +/− |", "|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['n']} | {r['diff_pts']} | {r['wins_losses']} |" for r in rows]
    return "\n".join(lines)


def by_position_markdown(answers: list[Answer], policies) -> str:
    """Returns exact-match counts per gold-passage position (questions answered under every policy)."""
    wanted = ("baseline", *policies)
    by_index: dict[int, dict[str, Answer]] = {}
    for a in answers:
        by_index.setdefault(a.index, {})[a.policy] = a
    complete = [got for got in by_index.values() if all(p in got for p in wanted) and got["baseline"].gold_index >= 0]
    positions = sorted({got["baseline"].gold_index for got in complete})
    lines = ["| gold position | n | " + " | ".join(wanted) + " |", "|---" * (len(wanted) + 2) + "|"]
    for pos in positions:
        rows = [got for got in complete if got["baseline"].gold_index == pos]
        cells = [str(sum(got[p].em for got in rows)) for p in wanted]
        lines.append(f"| {pos + 1} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ttft_markdown(ttft: dict) -> str:
    """Returns the long-prompt TTFT of every policy as a Markdown table."""
    lines = [f"TTFT p50 of {ttft['repeats']} alternating runs, {ttft['cached_tokens']:,} cached + "
             f"{ttft['uncached_tokens']} uncached tokens.", "",
             "| policy | TTFT ms | speedup vs full prefill |", "|---|---|---|"]
    lines += [f"| {p} | {ms} | {ttft['speedup'][p]}× |" for p, ms in ttft["ttft_ms"].items()]
    return "\n".join(lines)


def run_encodings(caches: dict, items, policies, *, task: Task, max_tokens: int, gap: int = 0, outs=None,
                  progress=None):
    """Yields (encoding, answer) for every item under every cache's encoding, from one full prefill per item.

    With `gap`, item i's schema declares the first `gap` passages of item i+1 before its own, as
    modules the prompt leaves out (as the accuracy bench's gap runs do).

    `caches` maps an encoding mode to a PromptCache made with it; the first one computes each
    item's full prefill and every other pairs with that same result. `outs` maps a mode to the
    file its answers (the baseline's included) are appended to as JSON lines.
    """
    for i, item in enumerate(items):
        base = None
        for mode, cache in caches.items():
            got, base = answer_item(cache, item, policies, task=task, max_tokens=max_tokens,
                                    gap_passages=gap_fillers(items, i, gap), baseline=base)
            if outs and outs.get(mode) is not None:
                outs[mode].writelines(json.dumps(asdict(a)) + "\n" for a in got)
                outs[mode].flush()
            yield from ((mode, a) for a in got)
        if progress:
            progress(1)
