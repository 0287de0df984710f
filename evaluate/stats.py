"""Paired bootstrap confidence intervals for differences between evaluation conditions (``scipy.stats.bootstrap``).

Every condition answers the same instances, so a difference is estimated on pairs: instances are resampled with
replacement and the mean of the per-instance differences is recomputed. Percentile intervals: they are defined for
degenerate samples (all differences equal), where BCa is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict:
        return {"mean": self.mean, "ci95": [self.low, self.high], "n": self.n}


def paired_difference_ci(
    a: Sequence[float], b: Sequence[float], *, n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval | None:
    """Mean of ``a − b`` over pairs with a percentile bootstrap CI; None without pairs.

    >>> paired_difference_ci([1, 1, 1], [0, 0, 0])
    Interval(mean=1.0, low=1.0, high=1.0, n=3)
    >>> ci = paired_difference_ci([1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1, 0, 1])
    >>> ci.mean, ci.low <= ci.mean <= ci.high
    (0.375, True)
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.size == 0:
        return None
    mean = float(diff.mean())
    if diff.size == 1 or np.all(diff == diff[0]):
        return Interval(mean, mean, mean, int(diff.size))
    result = bootstrap(
        (diff,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
        vectorized=True,
    )
    low, high = result.confidence_interval
    return Interval(mean, float(low), float(high), int(diff.size))


def mean_ci(values: Sequence[float], **kwargs) -> Interval | None:
    """Mean of one sample with its bootstrap CI (a difference against zero)."""
    return paired_difference_ci(values, [0.0] * len(values), **kwargs)
