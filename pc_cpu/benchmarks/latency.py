"""Time to first token of full prefill vs cached prompts (paper Figs 3-5, Table 2) on one machine, one run.

Every comparison uses the same tokens, threads and context size; baseline and cached runs alternate so
machine noise hits both. Tiers: "resident" (module cells in the context), "ram" (evicted from the context with PromptCache.evict,
restored from the RAM tier), "disk" (evicted, RAM tier emptied, the store's files dropped from the OS
page cache with posix_fadvise, restored from the disk tier; the same method as bench/ttft.py).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable

from pc_cpu.benchmarks import workloads
from pc_cpu.benchmarks.timing import break_even_uses, fit, kv_bytes_per_token, r_squared, stats
from pc_cpu.pml.schema import parse_schema

Progress = Callable[[int], None]


def open_cache(model, threads: int, n_ctx: int, **options):
    """Returns a PromptCache of n_ctx cells, or of the model's training context when that is smaller.

    These benches size n_ctx for cells (resident modules beside a prompt), not for positions: each
    prompt they ask fits the training context, and PromptCache refuses an n_ctx beyond it.
    """
    from pc_cpu import PromptCache
    from pc_cpu.engine.llama.model import Model
    from pc_cpu.model_path import resolve_model_path

    probe = Model(resolve_model_path(model))  # mapped, not read: ~0.1 s, outside every timing
    try:
        trained = probe.info.n_ctx_train
    finally:
        probe.close()
    return PromptCache(model, threads=threads, n_ctx=min(n_ctx, trained) if trained else n_ctx, **options)


def _ttft(pc, prompt: str, *, use_cache: bool = True):
    return pc.generate(prompt, max_tokens=1, use_cache=use_cache)


def _alternating(pc, prompt: str, repeats: int) -> tuple[list[float], list[float]]:
    """Returns TTFTs (ms) of full prefill and cached runs, alternating, after one untimed cached run."""
    _ttft(pc, prompt)
    base, cached = [], []
    for _ in range(repeats):
        base.append(_ttft(pc, prompt, use_cache=False).ttft_ms)
        cached.append(_ttft(pc, prompt).ttft_ms)
    return base, cached


def drop_page_cache(directory: Path) -> None:
    """Asks the OS to forget the store's files, so a disk-tier restore reads the disk (best effort)."""
    for path in directory.rglob("*"):
        if path.is_file() and hasattr(os, "posix_fadvise"):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _tier_run(pc, prompt: str, tier: str, store_dir: Path):
    """Returns the Result of one cached run with the modules first moved down to `tier`."""
    if tier in ("ram", "disk"):
        pc.evict()  # frees the context cells; the blobs stay in the byte tiers
    if tier == "disk":
        ram = pc.store.tier("ram")
        for key in list(ram.keys()):
            ram.remove(key)
        drop_page_cache(store_dir)
    return _ttft(pc, prompt)


def tiers(model, threads: int, workload: workloads.Workload, *, repeats: int, n_ctx: int) -> dict:
    """Returns TTFT stats for baseline, resident, RAM and disk tiers, plus encoding cost and memory.

    One cache (one context, one disk store in a temp dir); per repeat the four settings alternate.
    """
    out: dict = {"workload": workload.name}
    with tempfile.TemporaryDirectory(prefix="pc_cpu_bench_") as tmp, open_cache(model, threads, n_ctx, store=tmp) as pc:
        store_dir = Path(tmp)
        t0 = time.perf_counter()
        pc.load_schema(workload.schema)
        encode_ms = (time.perf_counter() - t0) * 1000
        ram_bytes = pc.store.tier("ram").bytes_used
        info = pc.model.info
        _ttft(pc, workload.prompt)  # warm-up
        timings: dict[str, list[float]] = {"baseline": [], "resident": [], "ram": [], "disk": []}
        seen = set()
        for _ in range(repeats):
            timings["baseline"].append(_ttft(pc, workload.prompt, use_cache=False).ttft_ms)
            for tier in ("resident", "ram", "disk"):
                r = _tier_run(pc, workload.prompt, tier, store_dir)
                timings[tier].append(r.ttft_ms)
                seen.update(f"{tier}:{t}" for t in r.tiers.values())
        plan = pc.plan(workload.prompt)
    b = stats(timings["baseline"])
    out.update(cached_tokens=plan.cached_tokens, uncached_tokens=plan.uncached_tokens, repeats=repeats,
               tiers_seen=sorted(seen), baseline=b.to_dict())
    for name in ("resident", "ram", "disk"):
        s = stats(timings[name])
        out[name] = {**s.to_dict(), "speedup_p50": round(b.p50 / s.p50, 1)}
    out["encode_ms"] = round(encode_ms, 1)
    out["encode_vs_prefill"] = round(encode_ms / b.p50, 2)
    out["break_even_uses"] = round(break_even_uses(encode_ms, b.p50, stats(timings["resident"]).p50), 2)
    theory = kv_bytes_per_token(info.n_layer, info.n_head_kv, info.n_embd_head)
    # The RAM tier holds every encoding of the schema (its preamble and modules) once: divide by their tokens.
    out["memory"] = {"ram_tier_bytes": ram_bytes, "encoded_tokens": plan.cached_tokens,
                     "bytes_per_token": round(ram_bytes / max(plan.cached_tokens, 1), 1),
                     "theory_bytes_per_token_f16": theory}
    return out


def length_sweep(model, threads: int, lengths, *, repeats: int, progress: Progress | None = None) -> dict:
    """Returns baseline and cached TTFT p50 per cached length, with quadratic and linear fits."""
    points = []
    for length in lengths:
        with open_cache(model, threads, 2 * length + 1024, store=False) as pc:
            w = workloads.multidoc(lambda t: pc.model.tokenize(t, special=False), length)
            pc.load_schema(w.schema)
            base, cached = _alternating(pc, w.prompt, repeats)
            plan = pc.plan(w.prompt)
            points.append({"cached_tokens": plan.cached_tokens, "uncached_tokens": plan.uncached_tokens,
                           "baseline": stats(base).to_dict(), "cached": stats(cached).to_dict()})
        if progress:
            progress(1)
    x = [p["cached_tokens"] for p in points]
    yb = [p["baseline"]["p50"] for p in points]
    yc = [p["cached"]["p50"] for p in points]
    out = {"points": points, "repeats": repeats}
    if len(points) >= 3:
        qb, lc = fit(x, yb, 2), fit(x, yc, 1)
        out["baseline_quadratic"] = {"coeffs": qb, "r2": round(r_squared(x, yb, qb), 4)}
        out["baseline_linear"] = {"coeffs": fit(x, yb, 1), "r2": round(r_squared(x, yb, fit(x, yb, 1)), 4)}
        out["cached_linear"] = {"coeffs": lc, "r2": round(r_squared(x, yc, lc), 4)}
    return out


def hit_ratio_curve(model, threads: int, total_tokens: int, fractions, *, repeats: int,
                    progress: Progress | None = None) -> dict:
    """Returns TTFT p50 of baseline and cached at a fixed prompt length for each fraction of cached tokens."""
    points = []
    with open_cache(model, threads, 2 * total_tokens + 1024, store=False) as pc:
        tokenize = lambda t: pc.model.tokenize(t, special=False)  # noqa: E731
        for i, fraction in enumerate(fractions):
            w = workloads.hit_ratio(tokenize, total_tokens, fraction, name=f"hit{i}")
            pc.load_schema(w.schema)
            base, cached = _alternating(pc, w.prompt, repeats)
            plan = pc.plan(w.prompt)
            b, c = stats(base), stats(cached)
            points.append({"fraction_target": fraction, "cached_tokens": plan.cached_tokens,
                           "uncached_tokens": plan.uncached_tokens,
                           "hit_ratio": round(plan.cached_tokens / max(len(plan.tokens), 1), 3),
                           "baseline": b.to_dict(), "cached": c.to_dict(), "speedup_p50": round(b.p50 / c.p50, 2)})
            pc.unload_schema(parse_schema(w.schema).name)
            if progress:
                progress(1)
    return {"total_tokens": total_tokens, "repeats": repeats, "points": points}


SIZES = {
    "smoke": {"tokens": 48, "repeats": 1, "lengths": (32, 64, 96), "hit_total": 64},  # tests, tiny model
    "quick": {"tokens": 1000, "repeats": 3, "lengths": (256, 512, 1024, 2048), "hit_total": 1024},
    "full": {"tokens": 2000, "repeats": 3, "lengths": (256, 1024, 2048, 4096, 7000), "hit_total": 1024},
}
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def steps(size: str) -> int:
    """Returns the progress steps `run` reports for a size."""
    return 3 + len(SIZES[size]["lengths"]) + len(FRACTIONS)


def run(model=None, threads: int = 2, size: str = "quick", progress: Progress | None = None) -> dict:
    """Returns every latency measurement of one size ("quick" or "full") as plain JSON-ready data."""
    cfg = SIZES[size]
    from pc_cpu.engine.llama.model import Model
    from pc_cpu.model_path import resolve_model_path

    path = resolve_model_path(model)
    tok_model = Model(path)
    try:
        tokenize = lambda t: tok_model.tokenize(t, special=False)  # noqa: E731
        loads = [workloads.multidoc(tokenize, cfg["tokens"]), workloads.template(tokenize, cfg["tokens"]),
                 workloads.code(tokenize, cfg["tokens"])]
        model_name = path.name  # not llama.cpp's description, which says "llama 256M Q4_1" for SmolLM2-135M
    finally:
        tok_model.close()
    n_ctx = 4 * cfg["tokens"] + 2048  # resident modules, a prefill of the same tokens, generation
    report = {"model": model_name, "threads": threads, "size": size, "workloads": []}
    for w in loads:
        report["workloads"].append(tiers(path, threads, w, repeats=cfg["repeats"], n_ctx=n_ctx))
        if progress:
            progress(1)
    report["length_sweep"] = length_sweep(path, threads, cfg["lengths"], repeats=max(2, cfg["repeats"] - 2),
                                          progress=progress)
    report["hit_ratio"] = hit_ratio_curve(path, threads, cfg["hit_total"], FRACTIONS, repeats=cfg["repeats"],
                                          progress=progress)
    return report
