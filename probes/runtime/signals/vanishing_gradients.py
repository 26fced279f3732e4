"""vanishing-gradients: tiny total norm, or early layers far below late ones, while the loss
is not improving (GM: small gradients with a falling loss are healthy)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, Severity
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import (
    early_late,
    finite,
    loss_improving,
    raw_norm,
)

TINY = 1e-8
RUN = {"weight_layers": ["fc1", "fc2"]}


class VanishingGradients(Signal):
    id = "vanishing-gradients"
    severities = ("warning", "critical")
    summary = (
        "Median total norm below vanishing_warning, or late/early layer norms above "
        "early_late_ratio, while the loss does not improve."
    )
    reads = frozenset({"grad_norm"})
    optional = frozenset(
        {"loss", "losses", "grad_norm_before_clip", "layer_grad_norms", "weight_layers"}
    )
    thresholds = ("vanishing_warning", "vanishing_critical", "early_late_ratio")
    message = "Median total gradient norm {median:.3g} is below {warn:g} and {loss_note}."
    advice = (
        "Use non-saturating activations (ReLU/GELU), He/Xavier init, normalisation layers and "
        "residual connections before touching the LR."
    )
    per_optimizer = True
    rank = 51
    consults = ("loss-diverging",)
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "tiny norms while the loss falls",
            None,
            series={"grad_norm": [TINY] * 12, "loss": [3.0 - 0.2 * s for s in range(1, 13)]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "tiny norms and a flat loss",
            "critical",
            series={"grad_norm": [TINY / 10] * 12, "loss": [1.0] * 12},
        ),
        Example(
            "early layer 10000x below the late one, flat loss",
            "warning",
            series={
                "grad_norm": [1.0] * 12,
                "loss": [1.0] * 12,
                "layer_grad_norms": [{"fc1": 1e-4, "fc2": 1.0}] * 12,
            },
            run=RUN,
            check={"module": "fc1", "early_layer": "fc1", "late_layer": "fc2"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        improving = loss_improving(run)
        if improving or ctx.has("loss-diverging"):
            return  # a diverging loss explains collapsed layers better (the step size)
        norms = finite(raw_norm(p) for p in run.steps)
        if not norms:
            return
        median = statistics.median(norms)
        warn = ctx.threshold("vanishing_warning")
        crit = ctx.threshold("vanishing_critical")
        ratio, early, late = early_late(run)
        limit = ctx.threshold("early_late_ratio")
        loss_note = "the loss is not improving" if improving is False else "no loss was seen"
        if 0 < median < warn:
            severity: Severity = "critical" if median < crit else "warning"
            yield ctx.finding(
                self.id,
                severity,
                self.message.format(median=median, warn=warn, loss_note=loss_note),
                module=early,
                fix=self.advice,
                median_norm=median,
                threshold_warning=warn,
                threshold_critical=crit,
                loss_improving=improving,
            )
        elif ratio is not None and ratio > limit:
            yield ctx.finding(
                self.id,
                "warning",
                f"The late layer `{late}` gets {ratio:.3g}× the gradient of the early layer "
                f"`{early}` (limit {limit:g}) and {loss_note}.",
                module=early,
                fix=self.advice,
                early_late_ratio=ratio,
                early_layer=early,
                late_layer=late,
                threshold=limit,
                loss_improving=improving,
            )
