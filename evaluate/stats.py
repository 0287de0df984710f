"""Paired cluster-bootstrap confidence intervals for differences between evaluation conditions.

Every condition answers the same instances, so a difference is estimated on pairs. Instances are not independent:
the perspectives of one FEVER/SciFact claim share its evidence, the questions of one PersonaMem context share its
history (``meta["group"]``, the split group key). So groups, not instances, are resampled with replacement, and the
mean of the per-instance differences is recomputed over the instances of the resampled groups. Without groups each
instance is its own group (the plain paired bootstrap). Percentile intervals: they are defined for degenerate
samples (all differences equal), where BCa is not.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

# Resampled group indices held at once (int64): bounds memory whatever the number of groups.
_CHUNK_CELLS = 1 << 20


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int  # instances (pairs)
    n_groups: int  # resampled units

    def as_dict(self) -> dict:
        return {"mean": self.mean, "ci95": [self.low, self.high], "n": self.n, "n_groups": self.n_groups}


def group_codes(groups: Sequence[Hashable] | None, n: int) -> np.ndarray:
    """Group index per instance, in order of first appearance; each instance its own group when ``groups`` is None.

    >>> group_codes(["c2", "c1", "c2"], 3).tolist(), group_codes(None, 3).tolist()
    ([0, 1, 0], [0, 1, 2])
    """
    if groups is None:
        return np.arange(n)
    if len(groups) != n:
        raise ValueError(f"groups and samples differ in length: {len(groups)} vs {n}")
    index: dict[Hashable, int] = {}
    return np.array([index.setdefault(g, len(index)) for g in groups], dtype=np.int64)


def paired_difference_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    groups: Sequence[Hashable] | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval | None:
    """Mean of ``a − b`` over pairs with a percentile cluster-bootstrap CI over ``groups``; None without pairs.

    >>> paired_difference_ci([1, 1, 1], [0, 0, 0])
    Interval(mean=1.0, low=1.0, high=1.0, n=3, n_groups=3)
    >>> ci = paired_difference_ci([1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1, 0, 1])
    >>> ci.mean, ci.low <= ci.mean <= ci.high
    (0.375, True)

    Two groups of five identical instances carry the information of two instances, not of ten:

    >>> a, b, g = [1] * 5 + [0] * 5, [0] * 10, ["x"] * 5 + ["y"] * 5
    >>> grouped, two = paired_difference_ci(a, b, groups=g), paired_difference_ci([1, 0], [0, 0])
    >>> (grouped.low, grouped.high) == (two.low, two.high) == (0.0, 1.0), grouped.n, grouped.n_groups
    (True, 10, 2)
    >>> flat = paired_difference_ci(a, b)
    >>> 0.0 < flat.low < flat.high < 1.0
    True
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.size == 0:
        return None
    codes = group_codes(groups, diff.size)
    sums, counts = np.bincount(codes, weights=diff), np.bincount(codes).astype(float)
    n_groups = sums.size
    mean = float(diff.mean())
    if n_groups == 1 or np.all(diff == diff[0]):
        return Interval(mean, mean, mean, int(diff.size), n_groups)
    rng = np.random.default_rng(seed)
    means = []
    chunk = max(1, _CHUNK_CELLS // n_groups)
    for start in range(0, n_resamples, chunk):
        idx = rng.integers(0, n_groups, size=(min(chunk, n_resamples - start), n_groups))
        # Groups differ in size: the resample's mean is its instances' total over its instance count.
        means.append(sums[idx].sum(axis=1) / counts[idx].sum(axis=1))
    alpha = (1 - confidence) / 2
    low, high = np.percentile(np.concatenate(means), [100 * alpha, 100 * (1 - alpha)])
    return Interval(mean, float(low), float(high), int(diff.size), n_groups)


def mean_ci(values: Sequence[float], **kwargs) -> Interval | None:
    """Mean of one sample with its (cluster-)bootstrap CI (a difference against zero); ``groups=`` as above."""
    return paired_difference_ci(values, [0.0] * len(values), **kwargs)
