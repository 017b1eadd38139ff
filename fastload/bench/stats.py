"""Percentiles of measured samples, in the units the report uses.

Example::

    >>> percentiles_ms([0.010, 0.020, 0.030])
    {'p50': 20.0, 'p95': 29.0, 'p99': 29.8}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ...}`` of ``values`` (linear interpolation); NaN when empty."""
    if not values:
        return {f"p{q}": float("nan") for q in qs}
    found = np.percentile(np.asarray(values, dtype=np.float64), list(qs))
    return {f"p{q}": float(v) for q, v in zip(qs, found)}


def percentiles_ms(seconds: Sequence[float], qs: Sequence[int] = (50, 95, 99)) -> dict[str, float]:
    """Percentiles of durations given in seconds, returned in milliseconds."""
    return {k: v * 1000.0 for k, v in percentiles(seconds, qs).items()}


def per_second(amount: float, seconds: float) -> float:
    """``amount / seconds``, or 0.0 for a run that took no time (nothing was measured)."""
    return amount / seconds if seconds > 0 else 0.0
