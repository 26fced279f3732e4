"""grad-norm-rising: the total gradient norm rises steadily over the run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.trend import norm_trend


class GradNormRising(Signal):
    id = "grad-norm-rising"
    severities = ("warning",)
    summary = (
        "The last quarter's median norm is > 10x the first quarter's, rising steadily; or it "
        "grew by more than norm_growth (orders of magnitude) however noisily."
    )
    reads = frozenset({"grad_norm"})
    thresholds = ("norm_growth",)
    optional = frozenset({"grad_norm_before_clip"})
    message = (
        "Total gradient norm rose steadily from {first:.3g} to {last:.3g} ({growth:.3g}×, "
        "rank correlation with step {correlation:.2f})."
    )
    advice = "Add norm clipping before it explodes and check the learning rate."
    per_optimizer = True
    rank = 55
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example("flat norms", None, series={"grad_norm": [0.5, 0.6, 0.5, 0.55] * 4}),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "norm growing 1.5x a step",
            "warning",
            series={"grad_norm": [0.14 * 1.5**s for s in range(1, 17)]},
        ),
        Example(
            "a noisy climb from 0.5 to 80, under the exploding threshold",
            "warning",
            series={
                "grad_norm": [
                    0.5,
                    0.8,
                    0.4,
                    0.6,
                    2.0,
                    0.9,
                    5.0,
                    3.0,
                    12.0,
                    6.0,
                    30.0,
                    20.0,
                    60.0,
                    35.0,
                    80.0,
                    70.0,
                ]
            },
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        trend = norm_trend(run)
        if trend is None or trend.first <= 0:
            return
        growth = trend.last / trend.first
        steady = growth > 10 and trend.correlation > 0.8
        # Orders of magnitude count even when noisy and under the exploding threshold.
        large = growth > ctx.threshold("norm_growth") and trend.correlation > 0.3
        if steady or large:
            yield ctx.finding(
                self.id,
                "warning",
                self.message.format(
                    first=trend.first,
                    last=trend.last,
                    growth=growth,
                    correlation=trend.correlation,
                ),
                fix=self.advice,
                first_median=trend.first,
                last_median=trend.last,
                growth=growth,
                correlation=trend.correlation,
            )
