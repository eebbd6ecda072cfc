"""Turns accuracy records into table rows: exact match with Wilson intervals, agreement, paired differences."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from pc_cpu.benchmarks.accuracy import Record
from pc_cpu.benchmarks.intervals import Interval, discordant, paired_difference, wilson

VARIANT_ORDER = {"baseline": 0, "preamble": 1, "independent": 2, "scaffold": 3}
SETTING_ORDER = {"single": 0, "modular": 1}


@dataclass(frozen=True)
class Row:
    """One table cell group: a (task, n, setting, variant, gap) over n_items paired items."""

    task: str
    n: int
    setting: str
    variant: str
    gap: int
    n_items: int
    em: Interval  # exact match, Wilson 95%
    agreement: Interval  # greedy output identical to baseline, Wilson 95%
    diff: Interval  # EM(variant) - EM(baseline), paired bootstrap 95%
    wins: int  # variant right where baseline wrong
    losses: int  # baseline right where variant wrong


def summarize(records: Iterable[Record]) -> list[Row]:
    """Returns one Row per (task, n, setting, variant, gap), paired against that setting's baseline."""
    records = list(records)
    baseline = {(r.task, r.n, r.setting, r.index): r.em for r in records if r.variant == "baseline"}
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.task, r.n, r.setting, r.variant, r.gap)].append(r)
    rows = []
    for (task, n, setting, variant, gap), recs in groups.items():
        paired = [(r.em, baseline[(task, n, setting, r.index)]) for r in recs
                  if (task, n, setting, r.index) in baseline]
        var = [int(v) for v, _ in paired]
        base = [int(b) for _, b in paired]
        wins, losses = discordant(var, base)
        rows.append(Row(task, n, setting, variant, gap, len(recs), wilson(sum(r.em for r in recs), len(recs)),
                        wilson(sum(r.same_as_baseline for r in recs), len(recs)), paired_difference(var, base),
                        wins, losses))
    rows.sort(key=lambda r: (r.task, r.n, SETTING_ORDER.get(r.setting, 9), r.gap,
                             VARIANT_ORDER.get(r.variant, 9)))
    return rows


def by_gold_position(records: Iterable[Record], variants=("baseline", "preamble")) -> dict[tuple, Interval]:
    """Returns {(task, n, setting, variant, gold_index): EM interval} for the gap-free records."""
    groups: dict[tuple, list[bool]] = defaultdict(list)
    for r in records:
        if r.gap == 0 and r.variant in variants:
            groups[(r.task, r.n, r.setting, r.variant, r.gold_index)].append(r.em)
    return {key: wilson(sum(v), len(v)) for key, v in sorted(groups.items())}


def markdown_table(rows: list[Row]) -> str:
    """Returns the rows as a Markdown table (percentages with 95% intervals, n per row)."""
    lines = ["| task | N | setting | variant | gap | n | exact match [95% CI] | identical to baseline | "
             "EM − baseline, pts [95% CI] | +/− |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        is_base = r.variant == "baseline"
        lines.append(f"| {r.task} | {r.n} | {r.setting} | {r.variant} | {r.gap} | {r.n_items} | {r.em.pct()} | "
                     f"{'—' if is_base else r.agreement.pct()} | {'—' if is_base else r.diff.pts()} | "
                     f"{'—' if is_base else f'{r.wins}/{r.losses}'} |")
    return "\n".join(lines)


def complete_items(records: Iterable[Record]) -> list[Record]:
    """Returns the records of items that have every variant their task's other items have (drops a cut-off item)."""
    records = list(records)
    shapes: dict[tuple, set] = defaultdict(set)
    for r in records:
        shapes[(r.task, r.n, r.index)].add((r.setting, r.variant, r.gap))
    full: dict[tuple, int] = defaultdict(int)
    for (task, n, _), shape in shapes.items():
        full[(task, n)] = max(full[(task, n)], len(shape))
    return [r for r in records if len(shapes[(r.task, r.n, r.index)]) == full[(r.task, r.n)]]
