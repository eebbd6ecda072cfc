"""Summary statistics of repeated timings: mean, p50, p95, and ratios of medians."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stats:
    n: int
    mean: float
    p50: float
    p95: float

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": round(self.mean, 2), "p50": round(self.p50, 2), "p95": round(self.p95, 2)}


def stats(values) -> Stats:
    """Returns mean, median and 95th percentile (linear interpolation) of `values` (ms)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        raise ValueError("no timings to summarise")
    p50, p95 = np.percentile(a, [50, 95])
    return Stats(int(a.size), float(a.mean()), float(p50), float(p95))


def break_even_uses(encode_ms: float, baseline_ms: float, cached_ms: float) -> float:
    """Returns the uses after which encoding once has paid for itself: encode / (baseline - cached).

    Infinite when a cached prompt is no faster than the baseline.
    """
    saved = baseline_ms - cached_ms
    return float("inf") if saved <= 0 else encode_ms / saved


def kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, bytes_per_value: int = 2) -> int:
    """Returns the theoretical K+V bytes per token: 2 · layers · kv_heads · head_dim · bytes (F16: 2)."""
    return 2 * n_layer * n_head_kv * head_dim * bytes_per_value


def fit(x, y, degree: int) -> list[float]:
    """Returns numpy.polyfit coefficients (highest power first) of y against x."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.RankWarning if hasattr(np, "exceptions") else Warning)
        return [float(c) for c in np.polyfit(np.asarray(x, float), np.asarray(y, float), degree)]


def r_squared(x, y, coeffs) -> float:
    """Returns the coefficient of determination of the polynomial `coeffs` on (x, y)."""
    y = np.asarray(y, float)
    pred = np.polyval(coeffs, np.asarray(x, float))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
