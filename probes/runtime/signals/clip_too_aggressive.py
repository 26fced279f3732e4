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
    thresholds = ("clip_active_fraction", "clip_cut_factor")
    message = (
        "Clipping at max_norm={max_norm:g} was active on {fraction:.0%} of steps and the median "
        "norm before clipping was {typical:.3g} ({cut:.3g}× max_norm): every update is cut to "
        "a fraction of its size, which slows convergence."
    )
    advice = (
        "Raise max_norm to about the typical norm of healthy steps (1.0 for Transformers, 5–10 "
        "for RNNs)."
    )
    per_optimizer = True
    rank = 60
    consults = (*MISPLACED, "loss-diverging")
    healthy: ClassVar[list[Example]] = [
        Example(
            "a Transformer at max_norm=1.0 with norms just above it",
            None,
            each={"events": ["backward", "clip", "step"], "clip_max_norm": 1.0, "clipped": True},
            series={"grad_norm_before_clip": [1.2, 1.4, 1.1, 1.3, 1.25, 1.2, 1.15]},
        ),
        Example(
            "clipped because the loss diverges: the step size is the cause",
            None,
            each={
                "events": ["backward", "clip", "step"],
                "clip_max_norm": 0.25,
                "clipped": True,
                "lr": 2000.0,
            },
            series={
                "grad_norm_before_clip": [5.0 * 2**s for s in range(12)],
                "loss": [8.8, 8.0, 7.9, 8.5, 12, 30, 60, 120, 250, 400, 500, 480],
            },
        ),
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
        if fraction <= limit or max_norm is None or not before or ctx.has("loss-diverging"):
            return
        typical = statistics.median(before)
        factor = ctx.threshold("clip_cut_factor")
        if max_norm <= 0 or typical <= factor * max_norm:
            return  # it trims, not cuts: what clipping at a healthy max_norm looks like
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(
                max_norm=max_norm, fraction=fraction, typical=typical, cut=typical / max_norm
            ),
            step=active[0].step,
            fix=self.advice,
            active_fraction=fraction,
            max_norm=max_norm,
            median_norm_before_clip=typical,
            threshold=limit,
            cut_factor=typical / max_norm,
            threshold_cut=factor,
        )
