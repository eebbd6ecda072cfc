"""Gives which cached tokens of a module a prompt computes again (selective recomputation).

Modules encoded apart never attended to each other; a full prefill's tokens do.
Recomputing some of a module's tokens during assembly lets them attend to
everything the prompt has before them (the other modules included), at the
price of computing them. (In a question over documents, several runs of recomputed
tokens are computed in one pass, each after the cached cells before it:
pc_cpu.engine.recompute.recompute_pass.) Assembly goes in position order, so a recomputed token
is decoded right where the layout puts it.

Policies, written as text (API `recompute=`, CLI `--recompute`, or a module's
`recompute="..."` attribute in a schema, which wins over the call's):

    "0" / "none"       nothing recomputed: the paper's behaviour (the default)
    "head:8"           the first 8 cached tokens of each module
    "tail:32"          the last 32
    "head:8,tail:32"   both
    "10%" or "0.1"     a fraction of each module's cached tokens, HEAD_SHARE of it at the head
    "all"              every cached token of the module (a full prefill at the layout positions)
    "select:15%"       the 15% of all imported module tokens whose layer-1 K/V deviate most from a
                       full prefill's (CacheBlend-style; the engine picks them, pc_cpu.engine.recompute.blend);
                       combines with the forms above, e.g. "tail:8,select:10%"
    "select:15%@module" the same tokens, refreshed module by module in position order, so the chosen
                       tokens of each module see the fresh cells of the modules before it (more,
                       smaller decodes); plain select: refreshes them all in as few batches as fit
    "relevant:1"       every cached token of the 1 imported module that shares the most (and rarest)
                       tokens with the prompt's own text: the passage the question is about sees the
                       rest of the prompt, as in a full prefill
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pc_cpu.errors import PromptCacheError

# Share of a fractional budget spent on a module's first tokens; the rest goes to its last.
# The last tokens were measured mattering more on NQ (tail 32: +3.3 points, head 8: +0.8), in a run that
# predates bench/RESULTS.md; `pc-cpu bench recompute run --policy tail:32 --policy head:8` measures it again.
HEAD_SHARE = 0.25


@dataclass(frozen=True)
class RecomputePolicy:
    head: int = 0  # first tokens of each module
    tail: int = 0  # last tokens of each module
    fraction: float = 0.0  # of each module's cached tokens, split by HEAD_SHARE
    select: float = 0.0  # of all imported module tokens, chosen by K/V deviation at assembly
    relevant: int = 0  # modules recomputed whole: the ones most like the prompt's own text
    select_by_module: bool = False  # refresh the selected tokens one module at a time, in position order

    def split(self, n: int) -> tuple[int, int]:
        """Returns (head, tail) token counts to recompute in a module of `n` cached tokens."""
        budget = round(self.fraction * n)
        head_part = round(budget * HEAD_SHARE)
        head = min(n, self.head + head_part)
        tail = min(n - head, self.tail + budget - head_part)
        return head, tail

    def choose(self, positions: list[int]) -> frozenset[int]:
        """Returns the positions to recompute out of a module's cached positions (in order)."""
        head, tail = self.split(len(positions))
        return frozenset(positions[:head]) | frozenset(positions[len(positions) - tail:] if tail else ())

    def __str__(self) -> str:
        parts = [f"head:{self.head}"] * bool(self.head) + [f"tail:{self.tail}"] * bool(self.tail)
        parts += [f"{self.fraction:.0%}"] * bool(self.fraction)
        parts += [f"select:{self.select:.0%}" + "@module" * self.select_by_module] * bool(self.select)
        parts += [f"relevant:{self.relevant}"] * bool(self.relevant)
        return ",".join(parts) or "0"


NO_RECOMPUTE = RecomputePolicy()


def most_relevant(candidates: Mapping[str, Sequence[int]], query: Sequence[int], count: int) -> list[str]:
    """Returns the `count` candidates (name -> tokens, in prompt order) sharing the most, and rarest, query tokens.

    A candidate's score is the sum, over distinct query tokens it contains, of log(1 + M / df):
    tokens that every candidate has (markup, "the") count little. Ties go to the earlier candidate.
    """
    if not count or not query:
        return []
    vocab = {name: set(tokens) for name, tokens in candidates.items() if tokens}
    df = Counter(t for tokens in vocab.values() for t in tokens)
    wanted = set(query)
    order = {name: i for i, name in enumerate(vocab)}

    def score(name: str) -> float:
        return sum(math.log(1 + len(vocab) / df[t]) for t in wanted & vocab[name])

    return sorted(vocab, key=lambda name: (-score(name), order[name]))[:count]


def contiguous_runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Returns sorted positions grouped into runs [start, end) of adjacent positions."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def parse_policy(text: "str | float | RecomputePolicy | None") -> RecomputePolicy:
    """Returns the policy `text` describes (see the module docstring); raises naming the valid forms."""
    if text is None:
        return NO_RECOMPUTE
    if isinstance(text, RecomputePolicy):
        return text
    if isinstance(text, (int, float)):
        return _fraction_policy(float(text), str(text))
    head = tail = 0
    fraction = select = 0.0
    relevant = 0
    by_module = False
    for part in (p.strip().lower() for p in str(text).split(",")):
        if part in ("0", "none", ""):
            continue
        if part == "all":
            fraction = 1.0
        elif part.startswith("relevant:"):
            relevant = _count(part[len("relevant:"):], text)
        elif part.startswith("select:"):
            value = part[len("select:"):]
            by_module = value.endswith("@module")
            select = _fraction_text(value.removesuffix("@module"), text)
        elif part.startswith(("head:", "tail:")):
            name, _, value = part.partition(":")
            count = _count(value, text)
            head, tail = (count, tail) if name == "head" else (head, count)
        else:
            fraction = _fraction_text(part, text)
    return RecomputePolicy(head, tail, fraction, select, relevant, by_module)


def _fraction_text(part: str, text) -> float:
    value = _number(part[:-1], text) / 100 if part.endswith("%") else _number(part, text)
    return _fraction_policy(value, text).fraction


def _fraction_policy(value: float, text) -> RecomputePolicy:
    if not 0 <= value <= 1:
        raise PromptCacheError(f"recompute {text!r}: a fraction must be between 0 and 1 (or 0% and 100%)")
    return RecomputePolicy(fraction=value)


def _number(value: str, text) -> float:
    try:
        return float(value)
    except ValueError:
        raise PromptCacheError(f"recompute {text!r} is not a policy; use 0, head:K, tail:K, head:K,tail:K, "
                               "a fraction such as 10% or 0.1, select:10%, select:10%@module, relevant:1, or all") from None


def _count(value: str, text) -> int:
    if not value.isdigit():
        raise PromptCacheError(f"recompute {text!r}: head, tail and relevant take a whole number, e.g. tail:32")
    return int(value)
