"""grad-norm-spikes: isolated steps far above the running median of the total norm."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import raw_norm

SPIKE_WINDOW = 10
MISPLACED_CLIP = ("clip-after-step", "clip-before-backward")


class GradNormSpikes(Signal):
    id = "grad-norm-spikes"
    severities = ("warning", "info")
    summary = "A step's norm is > spike_factor × the running median and the next step is not."
    reads = frozenset({"grad_norm"})
    optional = frozenset({"grad_norm_before_clip", "clipped"})
    thresholds = ("spike_factor",)
    message = (
        "{count} isolated gradient-norm spike(s); the first at step {step}: {value:.3g} against "
        "a running median of {median:.3g} ({ratio:.3g}×)."
    )
    advice = "Clip the total norm; check the batch of the spike step for outliers."
    contained_advice = (
        "Keep the clipping; if spikes are frequent, check the batches of the spike steps."
    )
    per_optimizer = True
    rank = 57
    consults = MISPLACED_CLIP
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example("no spike", None, series={"grad_norm": [0.5, 0.6, 0.55, 0.5] * 4})
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "one 200x step",
            "warning",
            series={"grad_norm": [100.0 if s == 9 else 0.5 for s in range(1, 17)]},
            check={"step": 9, "contained_by_clipping": False},
        ),
        Example(
            "one spike capped by a well-placed clip",
            "info",
            each={"events": ["backward", "clip", "step"], "clip_max_norm": 1.0},
            series={
                "grad_norm_before_clip": [100.0 if s == 9 else 0.5 for s in range(1, 17)],
                "grad_norm": [1.0 if s == 9 else 0.5 for s in range(1, 17)],
                "clipped": [s == 9 for s in range(1, 17)],
            },
            check={"contained_by_clipping": True},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        points = [p for p in run.steps if raw_norm(p) is not None]
        norms = [raw_norm(p) or 0.0 for p in points]
        factor = ctx.threshold("spike_factor")
        spikes: list[tuple[int, float, float]] = []
        for i in range(5, len(norms) - 1):
            window = norms[max(0, i - SPIKE_WINDOW) : i]
            median = statistics.median(window)
            if median <= 0 or norms[i] <= factor * median:
                continue
            if norms[i + 1] > factor * median:
                continue  # not isolated: a level shift or a rise, not a spike
            spikes.append((i, norms[i], median))
        if not spikes:
            return
        index, value, median = spikes[0]
        # Spikes that a correctly placed clip capped are what clipping is for: worth knowing,
        # not a warning.
        contained = not ctx.has(*MISPLACED_CLIP) and all(points[i].clipped for i, _, _ in spikes)
        yield ctx.finding(
            self.id,
            "info" if contained else "warning",
            self.message.format(
                count=len(spikes),
                step=points[index].step,
                value=value,
                median=median,
                ratio=value / median,
            )
            + (" The script's clipping capped each of them." if contained else ""),
            step=points[index].step,
            fix=self.contained_advice if contained else self.advice,
            contained_by_clipping=contained,
            spikes=len(spikes),
            first_spike=value,
            running_median=median,
            factor=factor,
        )
