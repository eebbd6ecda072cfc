"""bench/loss_by_model.py: each model's loss is against its own full prefill, paired by question."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "loss_by_model.py"


def _module():
    spec = importlib.util.spec_from_file_location("loss_by_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path, rows):
    fields = {"same_as_baseline": False, "ttft_ms": 1.0, "recomputed_share": 0.0, "gold_index": 0}
    path.write_text("".join(json.dumps({"index": i, "policy": p, "em": em, **fields}) + "\n" for i, p, em in rows))
    return path


def test_losses_are_against_each_models_own_full_prefill(tmp_path):
    f = _write(tmp_path / "a.jsonl", [(1, "baseline", True), (1, "0", False),   # lost
                                      (2, "baseline", False), (2, "0", True),   # gained
                                      (3, "baseline", True), (3, "0", True),    # kept
                                      (4, "0", True)])                          # no full prefill: left out
    assert _module().losses([f]) == {"0": {1: -1, 2: 1, 3: 0}}


def test_main_pairs_only_questions_both_models_answered(tmp_path, capsys, monkeypatch):
    a = _write(tmp_path / "a.jsonl", [(1, "baseline", True), (1, "0", True), (2, "baseline", True), (2, "0", True)])
    b = _write(tmp_path / "b.jsonl", [(1, "baseline", True), (1, "0", False), (3, "baseline", True), (3, "0", False)])
    monkeypatch.setattr("sys.argv", ["loss_by_model", "--a", str(a), "--b", str(b)])
    _module().main()
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| 0 | 1 | +0.0 | -100.0 | +100.0 ")
