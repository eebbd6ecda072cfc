"""`pc-cpu bench documents`: the RAG and relocation benches run end to end on the tiny model and report sane fields."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.test_cli import run_main

TOPICS = ["Paris", "Fuji", "Nile", "Everest", "Amazon", "Sahara", "Danube", "Alps", "Andes", "Gobi", "Rhine", "Volga",
          "Etna", "Congo"]


@pytest.fixture
def nq_data(tmp_path, monkeypatch):
    """A small NQ-open oracle file in the evaluation-data format, pointed to by $PC_CPU_EVALDATA."""
    with gzip.open(tmp_path / "nq-open-oracle.jsonl.gz", "wt", encoding="utf-8") as f:
        for i, topic in enumerate(TOPICS):
            f.write(json.dumps({"question": f"Where is {topic}?", "answers": [f"place {i}"],
                                "ctxs": [{"title": topic, "text": f"{topic} is found at place {i}, far away."}]}) + "\n")
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path))


def test_rag_reports_ttft_growth_bytes_and_adding_one(nq_data, tiny_model_path, tmp_path, capsys):
    args = ["bench", "documents", "rag", "--model", str(tiny_model_path), "--docs", "8", "--prompts", "3",
            "--no-peers", "--recompute", "all", "--json"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    r = json.loads(out)
    full = r["by_library_size"]["8"]
    redone = full["recompute"]["all"]
    assert redone["identical_answers"] == 1.0  # every moved document computed again: the full prefill's answers
    assert redone["accuracy"] == full["accuracy_full"] and redone["vs_full_prefill"]["estimate"] == 0.0
    assert r["docs"] == 8 and full["n"] == 3 and "peers" not in r
    assert r["resident_cells"] == 0  # documents live in the byte tiers only
    assert r["ram_bytes"] > 0 and r["disk_bytes"] > 0 and r["library_tokens"] > 8 * 5
    assert 0 < full["cached_p50_ms"] and 0 < full["baseline_p50_ms"] and full["speedup_p50"] > 0
    assert full["uncached_only_p50_ms"] > 0 and r["add_vs_prefill"] > 0
    assert 0 <= full["identical_answers"] <= 1


def test_rag_markdown_and_relocation(nq_data, tiny_model_path, capsys):
    code, out, err = run_main(["bench", "documents", "rag", "--model", str(tiny_model_path), "--docs", "6",
                               "--prompts", "1", "--no-peers"], capsys)
    assert code == 0, err
    assert "| speedup at p50 |" in out and "| resident context cells | 0 |" in out
    code, out, err = run_main(["bench", "documents", "relocation", "--model", str(tiny_model_path), "--n", "4",
                               "--json"], capsys)
    assert code == 0, err
    r = json.loads(out)
    assert r["c_path_ms_median"] > 0 and r["seq_add_path_ms_median"] > 0 and r["one_pass_ms_median"] > 0
    assert set(r["paired"]) == {"moved_minus_at_position", "moved_minus_full", "at_position_minus_full"}
    assert 0 <= r["accuracy_moved"] <= 1


def test_missing_data_is_one_error_line(tiny_model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path / "nowhere"))
    code, _, err = run_main(["bench", "documents", "rag", "--model", str(tiny_model_path), "--docs", "6"], capsys)
    assert code == 2 and err.startswith("error: evaluation file") and "Traceback" not in err
