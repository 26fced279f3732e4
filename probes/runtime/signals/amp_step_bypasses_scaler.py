"""amp-step-bypasses-scaler: optimizer.step() called directly while a GradScaler scales."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events


class AmpStepBypassesScaler(Signal):
    id = "amp-step-bypasses-scaler"
    severities = ("critical",)
    summary = "A step whose loss was scaled calls optimizer.step() not through scaler.step()."
    reads = frozenset({"events"})
    message = (
        "optimizer.step() was called directly while a GradScaler scaled the loss ({count} "
        "step(s), first: step {step}): the update applied gradients still multiplied by the "
        "scale, and overflowed steps are not skipped."
    )
    advice = "Use scaler.step(optimizer) followed by scaler.update()."
    rank = 41
    healthy: ClassVar[list[Example]] = [
        Example(
            "scaler.step then scaler.update",
            None,
            each={
                "events": ["zero-grad", "scale", "backward", "scaler-step", "step", "scaler-update"]
            },
            series={"grad_norm": [0.5, 0.5, 0.5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "optimizer.step after a scaled backward",
            "critical",
            each={"events": ["zero-grad", "scale", "backward", "step"]},
            series={"grad_norm": [0.5, 0.5, 0.5]},
            check={"step": 1, "steps_affected": 3},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        steps: list[int] = []
        for point in run.steps:
            calls = events(point)
            if "scale" not in calls:
                continue
            for position, call in enumerate(calls):
                if call == "step" and (position == 0 or calls[position - 1] != "scaler-step"):
                    steps.append(point.step)
                    break
        if steps:
            yield ctx.finding(
                self.id,
                "critical",
                self.message.format(count=len(steps), step=steps[0]),
                step=steps[0],
                fix=self.advice,
                steps_affected=len(steps),
            )
