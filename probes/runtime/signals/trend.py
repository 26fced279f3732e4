"""Shared reading of the total-norm trend for grad-norm-rising / grad-norm-decaying."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import rank_correlation, raw_norm

#: Fewer steps than this say nothing about a trend.
MIN_TREND_STEPS = 8


@dataclass(frozen=True)
class Trend:
    first: float
    """Median raw norm of the first quarter of the steps."""
    last: float
    """Median raw norm of the last quarter."""
    correlation: float
    """Rank correlation of the norm with the step."""


def norm_trend(run: RunSeries) -> Trend | None:
    """The trend of the raw total norm, or None with too few steps."""
    norms = [n for p in run.steps if (n := raw_norm(p)) is not None]
    if len(norms) < MIN_TREND_STEPS:
        return None
    quarter = max(2, len(norms) // 4)
    return Trend(
        first=statistics.median(norms[:quarter]),
        last=statistics.median(norms[-quarter:]),
        correlation=rank_correlation(norms),
    )
