"""clip-never-active: clipping is configured but never triggered while training is unstable."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import finite, step_loss

MISPLACED = ("amp-clip-without-unscale", "clip-after-step", "clip-before-backward")


def unstable(run: RunSeries, ctx: Context) -> bool:
    """Non-finite values, spikes, or a loss whose last third is 1.5x its first third."""
    if ctx.first_nonfinite is not None or ctx.has("grad-norm-spikes"):
        return True
    losses = finite(step_loss(p) for p in run.steps)
    if len(losses) < 6:
        return False
    third = len(losses) // 3
    return statistics.fmean(losses[-third:]) > 1.5 * statistics.fmean(losses[:third])


class ClipNeverActive(Signal):
    id = "clip-never-active"
    severities = ("info",)
    summary = "A norm clip that never cut anything while the run was unstable."
    reads = frozenset({"clipped", "clip_max_norm", "grad_norm_before_clip"})
    optional = frozenset({"loss", "losses"})
    message = (
        "Clipping at max_norm={max_norm:g} never triggered (largest norm {largest:.3g}) while "
        "training was unstable."
    )
    advice = "Lower max_norm towards the norm of healthy steps."
    per_optimizer = True
    rank = 61
    consults = (*MISPLACED, "grad-norm-spikes")
    healthy: ClassVar[list[Example]] = [
        Example(
            "never active and calm",
            None,
            each={
                "events": ["backward", "clip", "step"],
                "grad_norm_before_clip": 0.66,
                "clip_max_norm": 100.0,
                "clipped": False,
                "loss": 1.0,
            },
            series={"grad_norm": [0.66] * 9},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "never active while the loss climbs",
            "info",
            each={
                "events": ["backward", "clip", "step"],
                "grad_norm_before_clip": 0.66,
                "clip_max_norm": 100.0,
                "clipped": False,
            },
            series={"loss": [1.0 + 0.5 * s for s in range(1, 10)], "grad_norm": [0.66] * 9},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        clipped = [p for p in run.steps if p.clipped is not None]
        if len(clipped) < 5 or ctx.has(*MISPLACED):
            return
        if any(p.clipped for p in clipped) or not unstable(run, ctx):
            return
        before = finite(p.grad_norm_before_clip for p in clipped)
        max_norm = clipped[-1].clip_max_norm
        if not before or max_norm is None:
            return
        yield ctx.finding(
            self.id,
            "info",
            self.message.format(max_norm=max_norm, largest=max(before)),
            fix=self.advice,
            max_norm=max_norm,
            median_norm_before_clip=statistics.median(before),
        )
