"""clip-too-aggressive: the script's norm clip is active on nearly every step."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import finite

#: Findings that mean the clip's activity says nothing about max_norm: fix those first.
MISPLACED = ("amp-clip-without-unscale", "clip-after-step", "clip-before-backward")


class ClipTooAggressive(Signal):
    id = "clip-too-aggressive"
    severities = ("warning",)
    summary = "Norm clipping active on more than clip_active_fraction of the steps."
    reads = frozenset({"clipped", "clip_max_norm", "grad_norm_before_clip"})
    thresholds = ("clip_active_fraction",)
    message = (
        "Clipping at max_norm={max_norm:g} was active on {fraction:.0%} of steps (median norm "
        "before clipping {typical:.3g}): every update is cut down, which slows convergence."
    )
    advice = (
        "Raise max_norm to about the typical norm of healthy steps (1.0 for Transformers, 5–10 "
        "for RNNs)."
    )
    rank = 60
    consults = MISPLACED
    healthy: ClassVar[list[Example]] = [
        Example(
            "clipping on a few steps",
            None,
            each={"events": ["backward", "clip", "step"], "clip_max_norm": 1.0},
            series={
                "grad_norm_before_clip": [0.5, 0.6, 2.0, 0.5, 0.7, 0.6, 0.5],
                "clipped": [False, False, True, False, False, False, False],
                "grad_norm": [0.5, 0.6, 1.0, 0.5, 0.7, 0.6, 0.5],
            },
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "max_norm 0.01 with norms of 5",
            "warning",
            each={
                "events": ["backward", "clip", "step"],
                "clip_max_norm": 0.01,
                "grad_norm_before_clip": 5.0,
                "clipped": True,
                "grad_norm": 0.01,
            },
            series={"loss": [1.0] * 7},
            check={"step": 1, "max_norm": 0.01},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        clipped = [p for p in run.steps if p.clipped is not None]
        if len(clipped) < 5 or ctx.has(*MISPLACED):
            return
        active = [p for p in clipped if p.clipped]
        fraction = len(active) / len(clipped)
        limit = ctx.threshold("clip_active_fraction")
        max_norm = clipped[-1].clip_max_norm
        before = finite(p.grad_norm_before_clip for p in clipped)
        if fraction <= limit or max_norm is None or not before:
            return
        typical = statistics.median(before)
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(max_norm=max_norm, fraction=fraction, typical=typical),
            step=active[0].step,
            fix=self.advice,
            active_fraction=fraction,
            max_norm=max_norm,
            median_norm_before_clip=typical,
            threshold=limit,
        )
