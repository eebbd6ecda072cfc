"""The recompute sweep's bookkeeping: pairing on complete questions, merging runs, the table and plot inputs."""

from __future__ import annotations

import json
from dataclasses import asdict

from pc_cpu.benchmarks.recompute import Answer, markdown, policies_in, read_answers, summarize


def _answers(policy, ems, same=None, start=0):
    same = same or [policy == "baseline"] * len(ems)
    return [Answer(start + i, policy, em, s, 100.0 if policy == "baseline" else 10.0, 0.1)
            for i, (em, s) in enumerate(zip(ems, same))]


def test_rows_pair_only_questions_answered_under_every_policy():
    answers = _answers("baseline", [True, False, True]) + _answers("20%", [False, True])  # question 2 unfinished
    rows = {r["policy"]: r for r in summarize(answers, ["20%"])}
    assert rows["baseline"]["n"] == rows["20%"]["n"] == 2
    assert rows["20%"]["wins_losses"] == "1/1"
    assert rows["20%"]["diff"][0] == 0.0
    assert rows["20%"]["ttft_speedup"] == 10.0


def test_runs_merge_and_a_repeated_baseline_counts_once(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(asdict(a)) + "\n"
                             for a in _answers("baseline", [True, True]) + _answers("0", [False, True])))
    second.write_text("".join(json.dumps(asdict(a)) + "\n"
                              for a in _answers("baseline", [False, False]) + _answers("select:10%", [True, True])))
    answers = read_answers([first, second])
    assert policies_in(answers) == ["0", "select:10%"]
    rows = {r["policy"]: r for r in summarize(answers, policies_in(answers))}
    assert rows["baseline"]["em"].startswith("100.0%")  # the first file's baseline, not the second's
    assert rows["0"]["wins_losses"] == "0/1" and rows["select:10%"]["wins_losses"] == "0/0"


def test_the_table_shows_the_long_prompt_speedup_when_timed():
    answers = _answers("baseline", [True]) + _answers("all", [True], [True])
    ttft = {"cached_tokens": 4012, "speedup": {"baseline": 1.0, "all": 0.98}}
    table = markdown(summarize(answers, ["all"], ttft), ttft)
    assert "speedup at 4,012 cached tok" in table and "| all | 1 |" in table and "0.98×" in table
