"""clip-before-backward: clipping ran before backward(), when there was nothing to clip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import clip_placements


class ClipBeforeBackward(Signal):
    id = "clip-before-backward"
    severities = ("critical",)
    summary = "A clip call runs after zero_grad() and before backward() in the same step."
    reads = frozenset({"events"})
    message = (
        "Clipping ran before backward() in {count} step(s), first in step {step}: there were "
        "no fresh gradients to clip."
    )
    advice = "Move the clip between backward() and optimizer.step()."
    rank = 21
    healthy: ClassVar[list[Example]] = [
        Example(
            "clip between backward and step",
            None,
            each={"events": ["zero-grad", "backward", "clip", "step"]},
            series={"loss": [1.0, 0.9]},
        )
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "zero_grad, clip, then backward",
            "critical",
            each={"events": ["zero-grad", "clip", "backward", "step"]},
            series={"loss": [1.0, 0.9]},
            check={"step": 1, "steps_affected": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        _, before = clip_placements(run)
        if before:
            yield ctx.finding(
                self.id,
                "critical",
                self.message.format(count=len(before), step=before[0]),
                step=before[0],
                fix=self.advice,
                steps_affected=len(before),
            )
