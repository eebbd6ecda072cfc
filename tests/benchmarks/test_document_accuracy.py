"""`pc-cpu bench documents accuracy`: paired answers of `ask` variants against the full prefill, resumable, summarized."""

from __future__ import annotations

import gzip
import json

import pytest

from pc_cpu.benchmarks import document_accuracy as da
from tests.benchmarks.test_documents import nq_data  # noqa: F401 (a fixture)
from tests.test_cli import run_main


def _run(tiny_model_path, tmp_path, capsys, *extra):
    args = ["bench", "documents", "accuracy", "--model", str(tiny_model_path), "--n", "2", "--policy", "0",
            "--policy", "all", "--max-tokens", "4", "--out", str(tmp_path / "answers.jsonl"), "--json", *extra]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    return json.loads(out)


def test_every_answer_is_recorded_and_recomputing_everything_is_the_full_prefill(nq_data, tiny_model_path,
                                                                                 tmp_path, capsys):
    rows = {row["policy"]: row for row in _run(tiny_model_path, tmp_path, capsys)}
    records = da.read_records(tmp_path / "answers.jsonl")
    assert len(records) == 2 * 3  # two items, each: the full prefill, `0` and `all`
    assert {r["index"] % 2 for r in records} == {1}  # reported on odd lines only
    by = {(r["index"], r["policy"]): r for r in records}
    for index in {r["index"] for r in records}:
        full, redone, cached = by[(index, da.FULL)], by[(index, "all")], by[(index, "0")]
        assert redone["text"] == full["text"]  # every document computed again after the others: the same tokens
        assert full["prompt_tokens"] == cached["prompt_tokens"] == redone["prompt_tokens"]
        assert full["uncached_tokens"] == full["prompt_tokens"] > cached["uncached_tokens"]
        assert full["documents"] == cached["documents"] and len(full["documents"]) == 5
    assert rows["all"]["diff"] == 0 and rows["all"]["gained"] == rows["all"]["lost"] == 0
    assert rows["0"]["n"] == rows["all"]["n"] == 2 and rows["0"]["speedup"] > 0


def test_the_exact_variant_answers_as_the_full_prefill_from_the_prefix_its_first_asking_left(nq_data, tiny_model_path,
                                                                                           tmp_path):
    job = da.AccuracyJob(models=(str(tiny_model_path),), policies=("0", da.EXACT, da.EXACT_RAM),
                         orders=("given", "relevant-last"), n=2, max_tokens=4)
    records = da.run(job, tmp_path / "answers.jsonl")
    assert len(records) == 2 * 2 * 4  # two items, two orders, each: the full prefill, `0`, `exact` and `exact-ram`
    by = {(r["index"], r["order"], r["policy"]): r for r in records}
    for index, order, _ in by:
        full, apart = by[(index, order, da.FULL)], by[(index, order, "0")]
        for again in (by[(index, order, da.EXACT)], by[(index, order, da.EXACT_RAM)]):
            assert again["text"] == full["text"]  # the exact prefix: the full prefill's cells, held or from RAM
            assert again["uncached_tokens"] == apart["uncached_tokens"] < full["uncached_tokens"]  # only the question


def test_the_repeated_question_variants_pass_the_policy_check():
    from pc_cpu.benchmarks.command import _check_document_policies

    _check_document_policies(["0", da.EXACT, da.EXACT_RAM])  # not recompute policies, and not refused as one


def test_a_second_run_resumes_and_writes_its_section_once(nq_data, tiny_model_path, tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text("# results\n\nkept above\n", encoding="utf-8")
    _run(tiny_model_path, tmp_path, capsys, "--results", str(results))
    before = (tmp_path / "answers.jsonl").read_text(encoding="utf-8")
    _run(tiny_model_path, tmp_path, capsys, "--results", str(results))
    assert (tmp_path / "answers.jsonl").read_text(encoding="utf-8") == before  # nothing asked twice
    text = results.read_text(encoding="utf-8")
    assert text.startswith("# results\n\nkept above\n") and text.count(da.BEGIN) == 1 == text.count(da.END)
    assert "| `all` | 2 |" in text and "bench documents accuracy" in text


def test_the_summary_pairs_each_variant_with_its_order_s_full_prefill():
    def rec(index, order, policy, correct, ttft):
        return {"model": "m", "task": "nq", "index": index, "order": order, "policy": policy, "correct": correct,
                "ttft_ms": ttft}

    records = [rec(1, "given", da.FULL, True, 1000), rec(1, "given", "0", False, 50),
               rec(3, "given", da.FULL, False, 1200), rec(3, "given", "0", False, 100),
               rec(1, "relevant-last", da.FULL, False, 1000), rec(1, "relevant-last", "0", True, 100),
               rec(5, "given", "0", True, 10)]  # no full prefill for item 5: not paired, not counted
    given, last = da.summarize(records)
    assert (given.order, given.n, given.accuracy, given.full_accuracy) == ("given", 2, 0.0, 0.5)
    assert (given.diff, given.gained, given.lost) == (-50.0, 0, 1)
    assert given.speedup == 16.0 and given.ttft_ms == 75 and not given.meets_goal  # medians of 20x and 12x
    assert (last.diff, last.gained, last.lost, last.speedup) == (100.0, 1, 0, 10.0)


def test_each_encoding_is_a_variant_and_records_from_before_encodings_read_as_the_preamble_one():
    def rec(index, policy, correct, **extra):
        return {"model": "m", "task": "nq", "index": index, "order": "given", "policy": policy, "correct": correct,
                "ttft_ms": 100 if policy != da.FULL else 1000, **extra}

    records = [rec(1, da.FULL, True, encoding=da.ANY), rec(1, "0", True, encoding="library"),
               rec(1, "0", False, encoding="preamble"), rec(3, da.FULL, True), rec(3, "0", False)]
    rows = {row.policy: row for row in da.summarize(records)}
    assert set(rows) == {"0", "0, preamble"}
    assert (rows["0"].n, rows["0"].diff) == (1, 0.0)
    assert (rows["0, preamble"].n, rows["0, preamble"].diff) == (2, -100.0)  # item 3 has no encoding field
    assert da.variant(rec(1, da.EXACT_RAM, True)) == da.EXACT_RAM


def test_a_library_of_each_item_alone_is_added_and_removed_around_it(nq_data, tiny_model_path, tmp_path):
    job = da.AccuracyJob(models=(str(tiny_model_path),), policies=("0",), encodings=("library", "preamble"), n=2,
                         max_tokens=4, library="item")
    records = da.run(job, tmp_path / "answers.jsonl")
    assert sorted(da.variant(r) for r in records) == sorted([da.FULL, "0", "0, preamble"] * 2)
    assert {r["library"] for r in records} == {"item"}
    with pytest.raises(ValueError, match="library 'all'"):
        da.run(da.AccuracyJob(models=(str(tiny_model_path),), library="all"), tmp_path / "other.jsonl")


@pytest.fixture
def kv_data(tmp_path, monkeypatch):
    """A KV retrieval file of 4 records (75 pairs "k<i>-<j>": "v<i>-<j>", the key asked k<i>-7), as $PC_CPU_EVALDATA."""
    with gzip.open(tmp_path / "kv-retrieval-75_keys.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(4):
            pairs = [[f"k{i}-{j}", f"v{i}-{j}"] for j in range(75)]
            f.write(json.dumps({"ordered_kv_records": pairs, "key": f"k{i}-7", "value": f"v{i}-7"}) + "\n")
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path))


def test_kv_items_put_one_pair_in_each_document(kv_data):
    odd = da.questions("kv", "odd", 10, 5)
    assert [q.index for q in odd] == [1, 3]
    q = odd[0]
    assert len(q.documents) == 5 and q.documents[q.gold_index] == '"k1-7": "v1-7"' and q.answers == ("v1-7",)
    assert q.question == 'Key: "k1-7"\nCorresponding value:'
    with pytest.raises(ValueError, match="split"):
        da.questions("kv", "third", 10, 5)


def test_several_pairs_per_document_keep_the_gold_pair_in_the_gold_document(kv_data):
    for q in da.questions("kv", "all", 4, 5, per_document=6):
        assert len(q.documents) == 5 and all(len(d.splitlines()) == 6 for d in q.documents)  # 30 pairs
        gold = f'"{q.answers[0].replace("v", "k", 1)}": "{q.answers[0]}"'
        assert [gold in d.splitlines() for d in q.documents].count(True) == 1 and gold in q.documents[q.gold_index]
    with pytest.raises(ValueError, match="per_document"):
        da.questions("kv", "all", 4, 5, per_document=0)


def test_runs_with_several_passages_per_document_are_their_own_rows(nq_data, tiny_model_path, tmp_path, capsys):
    rows = _run(tiny_model_path, tmp_path, capsys, "--per-document", "2")
    records = da.read_records(tmp_path / "answers.jsonl")
    assert {r["per_document"] for r in records} == {2} and {row["task"] for row in rows} == {"nq 2/doc"}
    assert all(len(r["documents"]) == 5 for r in records)
    single = _run(tiny_model_path, tmp_path, capsys)  # the same file: one passage per document is another run
    assert {row["task"] for row in single} == {"nq", "nq 2/doc"}
    assert len(da.read_records(tmp_path / "answers.jsonl")) == 2 * len(records)


def test_a_policy_documents_cannot_use_is_refused_before_the_model_loads(capsys):
    code, _, err = run_main(["bench", "documents", "accuracy", "--model", "/nowhere.gguf", "--policy", "select:10%@module"],
                            capsys)
    assert code != 0 and "@module" in err and "schema prompts" in err


def test_a_run_in_blocks_resumes_without_adding_the_answered_items_documents(nq_data, tiny_model_path, tmp_path,
                                                                              monkeypatch):
    from pc_cpu import PromptCache

    added = []
    add = PromptCache.add_document
    monkeypatch.setattr(PromptCache, "add_document", lambda self, text, **kw: added.append(text) or add(self, text, **kw))
    job = da.AccuracyJob(models=(str(tiny_model_path),), policies=("0",), n=1, max_tokens=4, block=1)
    first = da.run(job, tmp_path / "answers.jsonl")
    items = da.questions("nq", "odd", 2, 5)
    assert sorted(added) == sorted(set(items[0].documents))  # one block: only the first item's documents
    added.clear()
    records = da.run(job.__class__(**{**job.__dict__, "n": 2}), tmp_path / "answers.jsonl")
    assert sorted(added) == sorted(set(items[1].documents))  # the answered block's documents are not added again
    assert len(records) == 2 * len(first) and {r["block"] for r in records} == {1}
    assert [r["index"] for r in records] == [items[0].index] * 2 + [items[1].index] * 2


def test_a_new_policy_over_a_kept_store_restores_the_documents_instead_of_computing_them(nq_data, tiny_model_path,
                                                                                        tmp_path):
    from pc_cpu import PromptCache

    store = tmp_path / "store"
    job = da.AccuracyJob(models=(str(tiny_model_path),), policies=("0",), n=2, max_tokens=4, store=str(store))
    first = da.run(job, tmp_path / "answers.jsonl")
    encoded = []
    ask = PromptCache.ask

    def counting(self, *args, **kwargs):
        result = ask(self, *args, **kwargs)
        encoded.append(self.documents.encoded)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PromptCache, "ask", counting)
        records = da.run(job.__class__(**{**job.__dict__, "policies": ("0", "all")}), tmp_path / "answers.jsonl")
    assert len(records) == len(first) + 2  # only the new policy's answers
    assert encoded and set(encoded) == {0}  # every document came from the store
    by = {(r["index"], r["policy"]): r for r in records}
    assert all(by[(i, "all")]["text"] == by[(i, da.FULL)]["text"] for i in {r["index"] for r in records})
