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
