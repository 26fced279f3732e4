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
    summary = "The last quarter's median norm is > 10x the first quarter's, rising steadily."
    reads = frozenset({"grad_norm"})
    optional = frozenset({"grad_norm_before_clip"})
    message = (
        "Total gradient norm rose steadily from {first:.3g} to {last:.3g} ({growth:.3g}×, "
        "rank correlation with step {correlation:.2f})."
    )
    advice = "Add norm clipping before it explodes and check the learning rate."
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
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        trend = norm_trend(run)
        if trend is None or trend.first <= 0:
            return
        growth = trend.last / trend.first
        if growth > 10 and trend.correlation > 0.8:
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
