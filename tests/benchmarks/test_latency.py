"""The latency and peer harnesses run end to end on the tiny model (numbers meaningless, shapes checked)."""

import math

import pytest

from pc_cpu.benchmarks import latency, peers, report
from pc_cpu.benchmarks.timing import break_even_uses, fit, kv_bytes_per_token, r_squared, stats


def test_stats_give_mean_median_and_p95():
    s = stats([1, 2, 3, 4, 100])
    assert (s.n, s.mean, s.p50) == (5, 22.0, 3.0) and 4 < s.p95 < 100


def test_break_even_is_encode_over_saving_and_infinite_without_saving():
    assert break_even_uses(1000, 600, 100) == 2.0
    assert math.isinf(break_even_uses(1000, 100, 100))


def test_kv_bytes_per_token_of_smollm2_f16():
    assert kv_bytes_per_token(30, 3, 64) == 23040  # SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K+V) x 2 B


def test_fits_recover_a_known_quadratic():
    x = [1, 2, 3, 4, 5]
    y = [2 * v * v + 3 * v + 1 for v in x]
    coeffs = fit(x, y, 2)
    assert coeffs == pytest.approx([2, 3, 1]) and r_squared(x, y, coeffs) == pytest.approx(1.0)


def test_latency_run_on_the_tiny_model(tiny_model_path):
    steps = []
    data = latency.run(tiny_model_path, threads=2, size="smoke", progress=steps.append)
    assert len(steps) == latency.steps("smoke")
    assert [w["workload"] for w in data["workloads"]] == ["multi-doc QA", "system template + param", "code context"]
    for w in data["workloads"]:
        assert w["cached_tokens"] > 0 and w["memory"]["bytes_per_token"] > 0
        # each measured tier really served its runs
        assert {"resident:context", "ram:ram", "disk:disk"} <= set(w["tiers_seen"])
    assert len(data["length_sweep"]["points"]) == 3 and "cached_linear" in data["length_sweep"]
    hits = [p["hit_ratio"] for p in data["hit_ratio"]["points"]]
    assert hits == sorted(hits) and hits[0] < 0.2 and hits[-1] > 0.8
    text = report.latency_markdown(data)
    assert "| multi-doc QA |" in text and "Fits" in text
    assert text.startswith(f"Model {tiny_model_path.name}, ")  # the file's name, not llama.cpp's description


def test_peers_run_on_the_tiny_model(tiny_model_path):
    data = peers.run(tiny_model_path, threads=2, doc_tokens=120, n_docs=4, repeats=1)
    names = [w["workload"] for w in data["workloads"]]
    assert names == ["shared prefix", "documents not a prefix"]
    systems = data["workloads"][0]["systems"]
    assert set(systems) == {"pc_cpu cached", "pc_cpu full prefill", "llama_cpp.Llama (in-context prefix reuse)",
                            "llama_cpp.Llama + LlamaRAMCache"}
    assert "| shared prefix |" in report.peers_markdown(data)
    assert report.peers_markdown(data).startswith(f"Model {tiny_model_path.name}, ")


def fake_report():
    point = lambda b, c: {"baseline": {"p50": b}, "cached": {"p50": c}}  # noqa: E731
    sweep = [{"cached_tokens": x, **point(x * x / 100 + x, 10 + x / 100)} for x in (256, 512, 1024, 2048)]
    hits = [{"hit_ratio": f, **point(1000, 1000 - 900 * f), "speedup_p50": 1000 / (1000 - 900 * f)}
            for f in (0, .5, 1)]
    return {"model": "fake", "threads": 2, "hit_ratio": {"total_tokens": 1024, "points": hits},
            "length_sweep": {"points": sweep, "baseline_quadratic": {"coeffs": [.01, 1, 0]},
                             "cached_linear": {"coeffs": [.01, 10]}}}


def test_plots_are_written_or_skipped_cleanly(tmp_path):
    from pc_cpu.benchmarks.plots import plot_latency

    data = fake_report()
    written = plot_latency(data, tmp_path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert written == []
    else:
        assert [p.name for p in written] == ["length_sweep.png", "hit_ratio.png"] and all(p.stat().st_size for p in written)
