"""Confidence intervals for proportions and for paired differences of per-question scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def pct(self) -> str:
        """Returns e.g. '28.3% [20.9, 37.0]'."""
        return f"{100 * self.estimate:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}]"

    def pts(self) -> str:
        """Returns a difference in points, e.g. '-13.3 [-21.7, -5.0]'."""
        return f"{100 * self.estimate:+.1f} [{100 * self.low:+.1f}, {100 * self.high:+.1f}]"


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    """Returns the proportion successes/n with its Wilson score interval (95% by default)."""
    if n <= 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the edges, not 1 - 1e-16
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high)


def paired_difference(variant, baseline, *, resamples: int = 4000, seed: int = 0) -> Interval:
    """Returns mean(variant - baseline) over paired questions with a 95% paired-bootstrap interval.

    Args:
        variant, baseline: equal-length sequences of 0/1 (or real) scores on the same questions.
    """
    a = np.asarray(variant, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need equal 1-D shapes, got {a.shape} and {b.shape}")
    if a.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    d = a - b
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return Interval(float(d.mean()), float(low), float(high))


def discordant(variant, baseline) -> tuple[int, int]:
    """Returns (variant right & baseline wrong, variant wrong & baseline right): McNemar's b and c."""
    pairs = list(zip(variant, baseline))
    return sum(1 for v, b in pairs if v and not b), sum(1 for v, b in pairs if b and not v)
