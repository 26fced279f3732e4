"""amp-clip-without-unscale: the clip ran on GradScaler-scaled gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events

SCALED_CLIP = ["zero-grad", "scale", "backward", "clip", "scaler-step", "step"]
UNSCALED_CLIP = ["zero-grad", "scale", "backward", "unscale", "clip", "scaler-step", "step"]


class AmpClipWithoutUnscale(Signal):
    id = "amp-clip-without-unscale"
    severities = ("critical",)
    summary = "With a GradScaler, clipping ran with no scaler.unscale_ before it."
    reads = frozenset({"events"})
    optional = frozenset({"scale", "grad_norm_before_clip"})
    message = (
        "Clipping ran on GradScaler-scaled gradients (no scaler.unscale_ before it) in "
        "{count} step(s): the clip saw norm {norm} at scale {scale}, so it clips ~scale× too "
        "hard and the real update is tiny."
    )
    advice = "Call scaler.unscale_(optimizer) right before clip_grad_norm_."
    rank = 40
    healthy: ClassVar[list[Example]] = [
        Example(
            "unscale_ before the clip",
            None,
            each={"events": UNSCALED_CLIP, "scale": 65536.0, "grad_norm_before_clip": 0.5},
            series={"grad_norm": [0.5, 0.5, 0.5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "clip on scaled gradients",
            "critical",
            each={
                "events": SCALED_CLIP,
                "scale": 65536.0,
                "grad_norm_before_clip": 3e4,
                "clip_max_norm": 1.0,
                "clipped": True,
            },
            series={"grad_norm": [0.66, 0.66, 0.66]},
            check={"step": 1, "steps_affected": 3, "scale": 65536.0},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        steps: list[int] = []
        for point in run.steps:
            calls = events(point)
            if "scale" not in calls:
                continue
            for position, call in enumerate(calls):
                if call == "clip" and "unscale" not in calls[:position]:
                    steps.append(point.step)
                    break
        if not steps:
            return
        point = next(p for p in run.steps if p.step == steps[0])
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(
                count=len(steps),
                norm=evidence_number(point.grad_norm_before_clip),
                scale=evidence_number(point.scale),
            ),
            step=steps[0],
            fix=self.advice,
            steps_affected=len(steps),
            scale=point.scale,
            clip_saw_norm=point.grad_norm_before_clip,
        )
