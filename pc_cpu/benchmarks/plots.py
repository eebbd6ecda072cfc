"""PNG plots of the latency results; matplotlib is optional (`pip install '.[bench]'`)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_latency(report: dict, out_dir: str | Path) -> list[Path]:
    """Writes length_sweep.png and hit_ratio.png; returns their paths ([] with a message if matplotlib is missing)."""
    plt = _pyplot()
    if plt is None:
        log.warning("matplotlib is not installed: no plots (pip install '.[bench]')")
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    sweep = report["length_sweep"]
    x = np.array([p["cached_tokens"] for p in sweep["points"]], float)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [p["baseline"]["p50"] for p in sweep["points"]], "o", label="full prefill (p50)")
    ax.plot(x, [p["cached"]["p50"] for p in sweep["points"]], "s", label="cached, resident (p50)")
    if "baseline_quadratic" in sweep:
        grid = np.linspace(0, x.max(), 200)
        ax.plot(grid, np.polyval(sweep["baseline_quadratic"]["coeffs"], grid), "-", alpha=.6, label="quadratic fit")
        ax.plot(grid, np.polyval(sweep["cached_linear"]["coeffs"], grid), "--", alpha=.6, label="linear fit")
    ax.set(xlabel="cached tokens", ylabel="TTFT (ms)", yscale="log",
           title=f"TTFT vs length — {report['model']}, {report['threads']} threads")
    ax.legend()
    fig.tight_layout()
    written.append(out_dir / "length_sweep.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    hit = report["hit_ratio"]["points"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ratio = [100 * p["hit_ratio"] for p in hit]
    ax.plot(ratio, [p["baseline"]["p50"] for p in hit], "o-", label="full prefill")
    ax.plot(ratio, [p["cached"]["p50"] for p in hit], "s-", label="cached")
    ax.set(xlabel="tokens from modules (%)", ylabel="TTFT p50 (ms)",
           title=f"Cache-hit ratio at ~{report['hit_ratio']['total_tokens']} tokens")
    ax2 = ax.twinx()
    ax2.plot(ratio, [p["speedup_p50"] for p in hit], "^:", color="gray", label="speedup")
    ax2.set(ylabel="speedup (×)", yscale="log")
    ax.legend(loc="upper center")
    fig.tight_layout()
    written.append(out_dir / "hit_ratio.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def plot_pareto(rows: list[dict], ttft: dict, path: str | Path, *, encoding: str = "preamble") -> Path | None:
    """Writes exact match vs full prefill (paired, 95% CI) against TTFT speedup, one point per policy."""
    plt = _pyplot()
    if plt is None:
        return None
    points = [r for r in rows if r["policy"] != "baseline" and ttft["speedup"].get(r["policy"])]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in points:
        mean, low, high = (100 * v for v in r["diff"])
        x = ttft["speedup"][r["policy"]]
        ax.errorbar(x, mean, yerr=[[mean - low], [high - mean]], fmt="o", capsize=3,
                    color="C1" if r["policy"].startswith("select") else "C0")
        below = r["policy"].startswith("select")  # select:r sits next to r: label it below, r above
        ax.annotate(r["policy"], (x, mean), textcoords="offset points", xytext=(5, -12 if below else 4), fontsize=8)
    ax.axhline(0, color="gray", lw=0.8)
    ax.axhspan(-2.5, 2.5, color="green", alpha=0.08, label="within 2.5 points")
    ax.axvline(4, color="gray", ls=":", lw=0.8, label="4× faster")
    n = points[0]["n"] if points else 0
    ax.set(xscale="log", xlabel=f"TTFT speedup vs full prefill at {ttft['cached_tokens']:,} cached tokens",
           ylabel="exact match − full prefill (points)",
           title=f"Recompute policies, {encoding} encoding: accuracy vs speed (n={n})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
