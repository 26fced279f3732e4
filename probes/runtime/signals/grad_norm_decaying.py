"""grad-norm-decaying: the total gradient norm decays towards zero."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import loss_improving
from gradient_doctor.probes.runtime.signals.trend import norm_trend


class GradNormDecaying(Signal):
    id = "grad-norm-decaying"
    severities = ("warning",)
    summary = "The norm falls > 100x steadily and ends below 0.1."
    reads = frozenset({"grad_norm"})
    optional = frozenset({"loss", "losses", "grad_norm_before_clip"})
    message = (
        "Total gradient norm decayed from {first:.3g} to {last:.3g} ({shrink:.3g}× smaller, "
        "rank correlation {correlation:.2f})."
    )
    advice = "Check the learning rate schedule and gradient flow (activations, init)."
    per_optimizer = True
    rank = 56
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "converging: the norm falls with the loss",
            None,
            series={
                "grad_norm": [0.7 * 0.5**s for s in range(1, 17)],
                "loss": [1.0 * 0.7**s for s in range(1, 17)],
            },
        ),
        Example(
            "converging from a large start",
            None,
            series={"grad_norm": [100 * 0.7**s for s in range(1, 17)]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "halving every step",
            "warning",
            series={"grad_norm": [0.7 * 0.5**s for s in range(1, 17)], "loss": [1.0] * 16},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        trend = norm_trend(run)
        if trend is None or trend.first <= 0 or loss_improving(run):
            return  # a norm falling with the loss is convergence (LBFGS on a small fit)
        if (
            trend.last / trend.first < 0.01
            and trend.correlation < -0.8
            and trend.last < 0.1  # towards zero, not merely converging from a large start
        ):
            yield ctx.finding(
                self.id,
                "warning",
                self.message.format(
                    first=trend.first,
                    last=trend.last,
                    shrink=trend.first / trend.last,
                    correlation=trend.correlation,
                ),
                fix=self.advice,
                first_median=trend.first,
                last_median=trend.last,
                correlation=trend.correlation,
            )
