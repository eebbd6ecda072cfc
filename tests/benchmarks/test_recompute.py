"""The recompute sweep's bookkeeping: pairing on complete questions, merging runs, the table and plot inputs."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, replace

from pc_cpu.benchmarks.recompute import (Answer, markdown, policies_in, read_answers, summarize, versus,
                                         versus_markdown)


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


def test_the_ttft_table_lists_every_policy_with_its_speedup():
    from pc_cpu.benchmarks.recompute import ttft_markdown

    ttft = {"repeats": 3, "cached_tokens": 4012, "uncached_tokens": 9,
            "ttft_ms": {"baseline": 16000.0, "20%": 3200.0}, "speedup": {"baseline": 1.0, "20%": 5.0}}
    table = ttft_markdown(ttft)
    assert "| 20% | 3200.0 | 5.0× |" in table and "4,012 cached + 9 uncached" in table


def test_ttft_run_and_pareto_plot_on_the_tiny_model(tiny_model_path, tmp_path):
    from click.testing import CliRunner

    from pc_cpu.benchmarks.command import bench

    plot = tmp_path / "pareto.png"
    result = CliRunner().invoke(bench, ["recompute", "run", "--model", str(tiny_model_path), "--n", "0", "--json",
                                        "--ttft-tokens", "120", "--quick", "--policy", "0",
                                        "--policy", "select:50%", "--policy", "all"])
    assert result.exit_code == 0, result.output
    ttft = json.loads(result.output)["ttft"]
    assert set(ttft["speedup"]) == {"baseline", "0", "select:50%", "all"} and ttft["cached_tokens"] >= 120
    answers = _answers("baseline", [True, False]) + _answers("0", [True, True]) + _answers("all", [True, False])
    from pc_cpu.benchmarks.plots import plot_pareto

    written = plot_pareto(summarize(answers, ["0", "all"]), ttft, plot)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert written is None
    else:
        assert written == plot and plot.stat().st_size > 0


def test_a_bad_policy_is_refused_before_the_model_loads():
    from click.testing import CliRunner

    from pc_cpu.benchmarks.command import bench

    result = CliRunner().invoke(bench, ["recompute", "run", "--policy", "sometimes", "--model", "/nonexistent.gguf"])
    assert result.exit_code != 0 and "sometimes" in str(result.exception or result.output)


def test_positions_table_counts_exact_matches_per_gold_position():
    from dataclasses import replace

    from pc_cpu.benchmarks.recompute import by_position_markdown

    answers = _answers("baseline", [True, True, False, True]) + _answers("0", [False, True, False, True])
    gold = {0: 0, 1: 1, 2: 1, 3: -1}  # question 3's position was not recorded: it has no row
    answers = [replace(a, gold_index=gold[a.index]) for a in answers]
    table = by_position_markdown(answers, ["0"])
    assert "| 1 | 1 | 1 | 0 |" in table and "| 2 | 2 | 1 | 1 |" in table
    assert "?" not in table and len(table.splitlines()) == 4


def test_kv_items_are_swept_with_every_policy_paired_on_one_encoding(make_cache):
    from pc_cpu.benchmarks.accuracy import kv_task
    from pc_cpu.benchmarks.evaldata import KVItem
    from pc_cpu.benchmarks.recompute import run_encodings

    pairs = tuple((f"key-{k}", f"value-{k}") for k in range(3))
    items = [KVItem(i, pairs, f"key-{i}", f"value-{i}", i) for i in range(2)]
    cache = make_cache(store=False)
    answers = [a for _, a in run_encodings({"preamble": cache}, items, ["0", "all"], task=kv_task(3, 1), max_tokens=3)]
    assert [(a.index, a.policy) for a in answers] == [(i, p) for i in (0, 1) for p in ("baseline", "0", "all")]
    share = {a.policy: a.recomputed_share for a in answers}
    assert share == {"baseline": 1.0, "0": 0.0, "all": 1.0}
    assert [a.gold_index for a in answers if a.policy == "baseline"] == [0, 1]
    assert not cache.schemas.names  # every item's schema unloaded


def test_versus_pairs_each_policy_with_the_other_runs_answers_by_question():
    mine = _answers("baseline", [True, False, True]) + _answers("0", [True, True, False])
    other = _answers("baseline", [True, False, False]) + _answers("0", [False, False, False], start=1)

    rows = {r["policy"]: r for r in versus(mine, other, ["0"])}

    assert rows["baseline"]["n"] == 3 and rows["baseline"]["wins_losses"] == "1/0"
    assert rows["0"]["n"] == 2 and rows["0"]["wins_losses"] == "1/0"  # questions 1 and 2 only
    assert rows["0"]["diff_pts"].startswith("+50.0")
    assert "| 0 | 2 | +50.0" in versus_markdown(list(rows.values()))


def _write(path, answers):
    path.write_text("".join(json.dumps(asdict(a)) + "\n" for a in answers))
    return str(path)


def test_summarize_reads_several_runs_files_with_no_model(tmp_path):
    from click.testing import CliRunner

    from pc_cpu.benchmarks.command import bench

    answers = [replace(a, gold_index=a.index) for a in _answers("baseline", [True, True]) + _answers("0", [False, True])]
    first = _write(tmp_path / "a.jsonl", answers[:1] + answers[2:3])  # question 0 in one run, question 1 in the other
    second = _write(tmp_path / "b.jsonl", answers[1:2] + answers[3:])
    ttft = tmp_path / "ttft.json"
    ttft.write_text(json.dumps({"ttft": {"repeats": 1, "cached_tokens": 4000, "uncached_tokens": 9,
                                         "ttft_ms": {"baseline": 900.0, "0": 30.0},
                                         "speedup": {"baseline": 1.0, "0": 30.0}}}))

    result = CliRunner().invoke(bench, ["recompute", "summarize", first, second, "--ttft-json", str(ttft), "--json"])

    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(result.output)["rows"]}
    assert rows["0"]["n"] == 2 and rows["0"]["wins_losses"] == "0/1" and rows["0"]["speedup_long"] == 30.0
    text = CliRunner().invoke(bench, ["recompute", "summarize", first, second]).output
    assert "| 0 | 2 | 50.0%" in text and "Exact matches by gold position" in text


def _two_runs(tmp_path) -> tuple[str, str]:
    """Returns answer files of two runs on the same questions: baseline +33.3 and policy 0 +50.0 points apart."""
    def known_gold(answers):  # as a run writes them: summarize then needs no evaluation data to find it
        return [replace(a, gold_index=a.index) for a in answers]

    mine = _write(tmp_path / "chain.jsonl",
                  known_gold(_answers("baseline", [True, False, True]) + _answers("0", [True, True, False])))
    other = _write(tmp_path / "preamble.jsonl", known_gold(
        _answers("baseline", [True, False, False]) + _answers("0", [False, False, False], start=1)))
    return mine, other


def test_compare_gives_each_policys_paired_difference_to_the_other_run(tmp_path):
    from click.testing import CliRunner

    from pc_cpu.benchmarks.command import bench

    mine, other = _two_runs(tmp_path)

    result = CliRunner().invoke(bench, ["recompute", "compare", mine, "--versus", other])

    assert result.exit_code == 0, result.output
    assert "| baseline | 3 | +33.3" in result.output and "| 0 | 2 | +50.0" in result.output
    missing = CliRunner().invoke(bench, ["recompute", "compare", mine])
    assert missing.exit_code != 0 and "--versus" in missing.output


def test_a_summary_with_versus_gives_the_summary_and_the_paired_difference(tmp_path):
    from click.testing import CliRunner

    from pc_cpu.benchmarks.command import bench

    mine, other = _two_runs(tmp_path)

    result = CliRunner().invoke(bench, ["recompute", "summarize", mine, "--versus", other])

    assert result.exit_code == 0, result.output
    assert "| 0 | 3 |" in result.output  # the summary's row of policy 0 over its 3 questions
    assert "| baseline | 3 | +33.3" in result.output and "| 0 | 2 | +50.0" in result.output  # and the difference


def test_a_gap_declares_the_next_items_passages_before_the_imported_ones_and_leaves_them_out(make_cache):
    from pc_cpu.benchmarks.accuracy import nq_task
    from pc_cpu.benchmarks.evaldata import DocItem, Passage
    from pc_cpu.benchmarks.recompute import run_encodings

    items = [DocItem(i, f"Who wrote book {i}?", (f"author {i}",),
                     tuple(Passage(f"T{i}{j}", f"Book {i}{j} was written by author {i}{j}.") for j in range(2)), 0)
             for i in range(2)]
    cache = make_cache(store=False)
    loaded, planned = [], []
    load, plan = cache.load_schema, cache.plan
    cache.load_schema = lambda pml, **kw: loaded.append(pml) or load(pml, **kw)
    cache.plan = lambda prompt, **kw: planned.append(plan(prompt, **kw)) or planned[-1]

    answers = [a for _, a in run_encodings({"preamble": cache}, items, ["0"], task=nq_task(2), max_tokens=2, gap=1)]

    assert [a.policy for a in answers] == ["baseline", "0"] * 2
    assert '<module name="g0">' in loaded[0] and "Book 10 was written" in loaded[0]  # item 1's first passage
    assert "Book 00 was written" in loaded[1]  # the last item takes the first item's
    assert all("g0" not in p.modules for p in planned) and all("d0" in p.modules for p in planned)


def test_several_encodings_pair_with_one_full_prefill_per_item(make_cache):
    from pc_cpu.benchmarks.accuracy import nq_task
    from pc_cpu.benchmarks.evaldata import DocItem, Passage
    from pc_cpu.benchmarks.recompute import run_encodings

    items = [DocItem(i, f"Who wrote book {i}?", (f"author {i}",),
                     tuple(Passage(f"T{i}{j}", f"Book {i}{j} was written by author {i}{j}.") for j in range(3)), 1)
             for i in range(2)]
    caches = {mode: make_cache(store=False, encoding=mode) for mode in ("preamble", "chain")}
    full_prefills = []
    for cache in caches.values():
        generate = cache.generate
        cache.generate = lambda prompt, _g=generate, **kw: (
            full_prefills.append(1) if kw.get("use_cache") is False else None) or _g(prompt, **kw)
    outs = {mode: io.StringIO() for mode in caches}

    got = list(run_encodings(caches, items, ["0"], task=nq_task(3), max_tokens=3, outs=outs))

    assert len(full_prefills) == len(items)  # not once per encoding
    assert [(m, a.index, a.policy) for m, a in got] == [
        (m, i, p) for i in (0, 1) for m in ("preamble", "chain") for p in ("baseline", "0")]
    baselines = {m: [a for n, a in got if n == m and a.policy == "baseline"] for m in caches}
    assert baselines["preamble"] == baselines["chain"]  # the same full prefill, written to both files
    for mode, f in outs.items():
        lines = [json.loads(line) for line in f.getvalue().splitlines()]
        assert [(r["index"], r["policy"]) for r in lines] == [(i, p) for i in (0, 1) for p in ("baseline", "0")]
    assert not any(c.schemas.names for c in caches.values())


def test_start_and_stop_answer_a_slice_of_the_whole_runs_items(tiny_model_path, tmp_path, monkeypatch):
    import gzip

    from click.testing import CliRunner

    from pc_cpu.benchmarks import evaldata
    from pc_cpu.benchmarks.command import bench

    nq = [{"question": f"Who wrote book {i}?", "answers": [f"author {i}"],
           "ctxs": [{"title": f"T{i}", "text": f"Book {i} was written by author {i}."}]} for i in range(12)]
    with gzip.open(tmp_path / evaldata.NQ_FILE, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in nq)
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path))
    out = tmp_path / "a.jsonl"
    args = ["recompute", "run", "--model", str(tiny_model_path), "--n", "10", "--docs", "3", "--policy", "0",
            "--ttft-tokens", "0", "--json"]

    result = CliRunner().invoke(bench, args + ["--start", "4", "--stop", "7", "--out", str(out)])

    assert result.exit_code == 0, result.output
    answered = list(dict.fromkeys(a.index for a in read_answers([out])))
    assert answered == [it.index for it in evaldata.run_items("nq", 3, 10)[4:7]]
    refused = CliRunner().invoke(bench, args + ["--start", "4", "--stop", "4"])
    assert refused.exit_code != 0 and "--stop 4" in refused.output
