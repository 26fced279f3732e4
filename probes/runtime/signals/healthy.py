"""healthy: the verdict when no signal reached warning on a run measured as planned."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, severity_at_least
from gradient_doctor.probes.runtime.result import optimizer_label
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import finite, raw_norm

#: Run statuses for which the steps were measured as planned (a log has no status).
MEASURED = (None, "ok", "stopped")


class Healthy(Signal):
    id = "healthy"
    severities = ("info",)
    summary = "Nothing at warning or above on a run that was measured as planned."
    reads = frozenset({"grad_norm"})
    optional = frozenset({"grad_norm_before_clip"})
    multi_message = (
        "{steps} steps measured: total gradient norm per optimizer {norms}; no NaN/Inf, "
        "layers balanced, nothing at warning or above."
    )
    message = (
        "{steps} steps measured: total gradient norm {low:.3g}–{high:.3g} (median "
        "{median:.3g}), no NaN/Inf, layers balanced, nothing at warning or above."
    )
    advice = ""
    rank = 1000  # last: it reads every other finding
    healthy: ClassVar[list[Example]] = [
        Example("a spike is not healthy", None, series={"grad_norm": [0.5] * 8 + [100.0, 0.5]}),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "calm norms and a falling loss",
            "info",
            series={"grad_norm": [0.66] * 12, "loss": [2.0 - 0.05 * s for s in range(1, 13)]},
            check={"steps": 12},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        if run.status not in MEASURED or not run.steps:
            return
        if any(severity_at_least(f.severity, "warning") for f in ctx.findings):
            return
        norms = finite(raw_norm(p) for p in run.steps)
        if not norms:
            return
        message = self.message.format(
            steps=len(run.steps),
            low=min(norms),
            high=max(norms),
            median=statistics.median(norms),
        )
        indices = run.optimizers()
        if len(indices) > 1:
            # A GAN's discriminator and generator norms are separate series: one range over
            # both would read as one run whose norm swings tenfold.
            parts = []
            for index in indices:
                own = finite(raw_norm(p) for p in run.steps if p.optimizer == index)
                if own:
                    label = optimizer_label(index, run.optimizer_kinds, run.optimizer_names)
                    parts.append(
                        f"{label} {min(own):.3g}–{max(own):.3g} (median "
                        f"{statistics.median(own):.3g})"
                    )
            message = self.multi_message.format(steps=len(run.steps), norms="; ".join(parts))
        yield ctx.finding(
            self.id,
            "info",
            message,
            median_norm=statistics.median(norms),
            min_norm=min(norms),
            max_norm=max(norms),
            steps=len(run.steps),
        )
