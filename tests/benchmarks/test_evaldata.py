"""Item drawing from the evaluation files, on tiny fake files written to a temp dir."""

import gzip
import json

import pytest

from pc_cpu.benchmarks import evaldata
from pc_cpu.errors import DataMissingError


def write_jsonl_gz(path, records):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


@pytest.fixture
def fake_dir(tmp_path, monkeypatch):
    nq = [{"question": f"q{i}?", "answers": [f"a{i}"], "ctxs": [{"title": f"T{i}", "text": f"text {i}"}]}
          for i in range(12)]
    write_jsonl_gz(tmp_path / evaldata.NQ_FILE, nq)
    kv = []
    for i in range(4):
        pairs = [[f"k{i}_{j}", f"v{i}_{j}"] for j in range(75)]
        kv.append({"ordered_kv_records": pairs, "key": pairs[40][0], "value": pairs[40][1]})
    write_jsonl_gz(tmp_path / evaldata.KV_FILE, kv)
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path))
    return tmp_path


def test_loads_questions_with_their_gold_passage(fake_dir):
    qs = evaldata.load_nq()
    assert len(qs) == 12 and qs[3].answers == ("a3",) and qs[3].gold.title == "T3"


def test_gold_passage_takes_each_position_in_turn(fake_dir):
    items = evaldata.doc_items(evaldata.load_nq(), 5, 10, seed=0)
    assert [it.gold_index for it in items] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    for it in items:
        gold = it.passages[it.gold_index]
        assert gold.text == f"text {it.index}" and len(it.passages) == 5
        assert len({p.title for p in it.passages}) == 5  # no distractor repeats the gold or another


def test_items_depend_only_on_the_seed(fake_dir):
    qs = evaldata.load_nq()
    assert evaldata.doc_items(qs, 3, 6, seed=1) == evaldata.doc_items(qs, 3, 6, seed=1)
    assert evaldata.doc_items(qs, 3, 6, seed=1) != evaldata.doc_items(qs, 3, 6, seed=2)


def test_kv_items_keep_the_queried_pair_at_its_turn(fake_dir):
    items = evaldata.kv_items(evaldata.load_kv(), 5, 4)
    for i, it in enumerate(items):
        assert len(it.pairs) == 5 and it.gold_index == i % 5
        assert it.pairs[it.gold_index] == (it.key, it.value)
        assert dict(it.pairs)[it.key] == it.value


def test_missing_file_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path))
    with pytest.raises(DataMissingError, match="PC_CPU_EVALDATA"):
        evaldata.load_nq()


def test_bad_sizes_are_refused(fake_dir):
    with pytest.raises(ValueError):
        evaldata.doc_items(evaldata.load_nq(), 0, 3)
    with pytest.raises(ValueError):
        evaldata.kv_items(evaldata.load_kv(), 76, 1)


def test_a_run_is_split_by_slicing_its_items_not_by_asking_for_fewer(fake_dir):
    # NQ distractors are drawn after the questions from one generator, so an 8-item run's items 4..7
    # are other prompts than items 4..7 of a 10-item run (a run was split that way by mistake on 2026-12-02:
    # bench/RESULTS.md, "Recompute policies on Qwen2.5-0.5B PML prompts").
    whole = evaldata.run_items("nq", 3, 10)
    fewer = evaldata.run_items("nq", 3, 8)
    assert [it.index for it in fewer] == [it.index for it in whole[:8]]
    assert [it.passages for it in fewer[4:]] != [it.passages for it in whole[4:8]]
    assert evaldata.run_items("kv", 3, 4)[:2] == evaldata.run_items("kv", 3, 2)
    assert evaldata.run_items("nq", 3, 0) == []
