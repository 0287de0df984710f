"""Deterministic train/validation/test splits by group key (no group in two splits)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

DEFAULT_RATIOS: dict[str, float] = {"train": 0.8, "validation": 0.1, "test": 0.1}


def check_ratios(ratios: Mapping[str, float]) -> None:
    """Ratios must be non-negative numbers summing to 1."""
    if not ratios:
        raise ValueError("split ratios must name at least one split")
    bad = {k: v for k, v in ratios.items() if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0}
    if bad:
        raise ValueError(f"split ratios must be non-negative numbers, got {bad}")
    if not math.isclose(sum(ratios.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"split ratios must sum to 1, got {dict(ratios)} (sum {sum(ratios.values())})")


def split_sizes(n: int, ratios: Mapping[str, float]) -> dict[str, int]:
    """Group counts per split: largest-remainder rounding of ``ratio * n``; when there are at least as many
    groups as splits with a positive ratio, each of them gets one or more.

    >>> split_sizes(10, DEFAULT_RATIOS)
    {'train': 8, 'validation': 1, 'test': 1}
    >>> split_sizes(3, DEFAULT_RATIOS)
    {'train': 1, 'validation': 1, 'test': 1}
    """
    check_ratios(ratios)
    names = list(ratios)
    exact = {k: ratios[k] * n for k in names}
    sizes = {k: math.floor(exact[k]) for k in names}
    # Hand the leftover groups to the largest fractional parts; ties go to the split listed first.
    for k in sorted(names, key=lambda k: (-(exact[k] - sizes[k]), names.index(k)))[: n - sum(sizes.values())]:
        sizes[k] += 1
    wanted = [k for k in names if ratios[k] > 0]
    if n >= len(wanted):
        for k in wanted:
            if sizes[k] == 0:
                donor = max(names, key=lambda d: (sizes[d], -names.index(d)))
                sizes[donor] -= 1
                sizes[k] += 1
    return sizes


def assign_splits(
    group_keys: Iterable[str],
    ratios: Mapping[str, float] = DEFAULT_RATIOS,
    seed: int | str = 0,
) -> dict[str, str]:
    """Map each unique group key to a split: groups are ordered by sha256(seed, key) and cut by ``ratios``."""
    groups = sorted(set(group_keys), key=lambda g: (hashlib.sha256(f"{seed}\x1f{g}".encode()).hexdigest(), g))
    sizes = split_sizes(len(groups), ratios)
    out: dict[str, str] = {}
    start = 0
    for name, size in sizes.items():
        for g in groups[start : start + size]:
            out[g] = name
        start += size
    return out
