"""The accuracy loop on the tiny model: every variant of every setting answers, paired with its baseline."""

from click.testing import CliRunner

from pc_cpu.benchmarks import accuracy
from pc_cpu.benchmarks.command import bench
from pc_cpu.benchmarks.evaldata import DocItem, Passage
from pc_cpu.benchmarks.summary import complete_items, summarize

ITEMS = [DocItem(i, f"What is {i}?", (f"thing {i}",),
                 tuple(Passage(f"T{i}{k}", f"Passage {k} of item {i} says thing {i}.") for k in range(3)), i % 3)
         for i in range(2)]


def test_every_variant_answers_and_the_baseline_agrees_with_itself(make_cache):
    caches = {m: make_cache(encoding=m, store=False) for m in accuracy.ENCODINGS}
    records = list(accuracy.run(caches, accuracy.nq_task(3), ITEMS, gaps=(2,), max_tokens=4))
    shape = {(r.setting, r.variant, r.gap) for r in records}
    assert shape == {("single", "baseline", 0), ("single", "preamble", 0), ("single", "independent", 0),
                     ("modular", "baseline", 0), ("modular", "preamble", 0), ("modular", "independent", 0),
                     ("modular", "scaffold", 0), ("modular", "preamble", 2)}
    assert len(records) == 2 * len(shape)
    assert all(r.same_as_baseline for r in records if r.variant == "baseline")
    assert all(r.cached_tokens > 0 for r in records if r.variant != "baseline")
    assert all(not c.schemas.names for c in caches.values())  # every schema unloaded after use
    assert len(summarize(records)) == len(shape)


def test_complete_items_drops_a_cut_off_item(make_cache):
    caches = {m: make_cache(encoding=m, store=False) for m in accuracy.ENCODINGS}
    records = list(accuracy.run(caches, accuracy.nq_task(3), ITEMS, settings=("modular",), max_tokens=2))
    cut = records[:-1]
    assert {r.index for r in complete_items(cut)} == {ITEMS[0].index}


def test_summary_command_reads_jsonl(tmp_path, make_cache):
    caches = {m: make_cache(encoding=m, store=False) for m in accuracy.ENCODINGS}
    path = tmp_path / "r.jsonl"
    with open(path, "w") as out:
        list(accuracy.run(caches, accuracy.nq_task(3), ITEMS, settings=("modular",), max_tokens=2, out=out))
    result = CliRunner().invoke(bench, ["summary", str(path)])
    assert result.exit_code == 0, result.output
    assert "| nq | 3 | modular | scaffold | 0 | 2 |" in result.output
    assert "gold position" in result.output


def test_bench_help_lists_the_commands():
    result = CliRunner().invoke(bench, ["--help"])
    assert result.exit_code == 0
    for name in ("latency", "accuracy", "peers", "summary"):
        assert name in result.output


def test_start_resumes_with_the_same_items(make_cache):
    caches = {m: make_cache(encoding=m, store=False) for m in accuracy.ENCODINGS}
    records = list(accuracy.run(caches, accuracy.nq_task(3), ITEMS, settings=("modular",), max_tokens=2, start=1))
    assert {r.index for r in records} == {ITEMS[1].index}


def test_kv_answers_have_room_for_the_restated_key_and_the_value(tiny_model_path):
    # SmolLM2 answers 'The value associated with the key "<uuid>" is "<uuid>".'; 64 tokens cut it mid-value.
    import random
    import uuid

    from pc_cpu.benchmarks.command import KV_MAX_TOKENS
    from pc_cpu.engine.llama.model import Model

    rng = random.Random(0)
    key, value = (uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(2))
    answer = f'The value associated with the key "{key}" is "{value}".'
    model = Model(tiny_model_path)
    try:
        assert len(model.tokenize(answer, special=False)) + 8 <= KV_MAX_TOKENS
    finally:
        model.close()
