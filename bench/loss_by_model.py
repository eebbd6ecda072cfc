"""Does a bigger model lose less to modular encoding? Compares two models' losses on the same questions.

Each model's loss on a question is its cached answer's score minus its own full prefill's (+1, 0 or
-1). The figure is the mean of (loss of A - loss of B) over the questions both runs answered, with a
paired-bootstrap interval, per policy. Positive: A loses less than B. Both runs must be
`pc-cpu bench recompute run` answer files of the same task, --docs and --n (the same items).

    python bench/loss_by_model.py --a bench/results/q15_nq5_chain.jsonl --b bench/results/q05_nq5_chain.jsonl
"""

from __future__ import annotations

import argparse

from pc_cpu.benchmarks.intervals import paired_difference
from pc_cpu.benchmarks.recompute import policies_in, read_answers


def losses(paths) -> dict[str, dict[int, int]]:
    """Returns {policy: {question index: score - full prefill's score}} of one model's answer files."""
    answers = read_answers(paths)
    full = {a.index: int(a.em) for a in answers if a.policy == "baseline"}
    out: dict[str, dict[int, int]] = {p: {} for p in policies_in(answers)}
    for a in answers:
        if a.policy != "baseline" and a.index in full:
            out[a.policy][a.index] = int(a.em) - full[a.index]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", action="append", required=True, help="answer file of model A (repeatable)")
    ap.add_argument("--b", action="append", required=True, help="answer file of model B (repeatable)")
    args = ap.parse_args()
    a, b = losses(args.a), losses(args.b)
    print("| policy | n | loss of A | loss of B | A − B, paired (pts) |")
    print("|---|---|---|---|---|")
    for policy in a:
        shared = sorted(set(a[policy]) & set(b.get(policy, {})))
        if not shared:
            continue
        la, lb = [a[policy][i] for i in shared], [b[policy][i] for i in shared]
        print(f"| {policy} | {len(shared)} | {100 * sum(la) / len(la):+.1f} | {100 * sum(lb) / len(lb):+.1f} "
              f"| {paired_difference(la, lb).pts()} |")


if __name__ == "__main__":
    main()
