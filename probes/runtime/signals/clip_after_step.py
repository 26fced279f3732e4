"""clip-after-step: clipping ran after optimizer.step(), so the update used unclipped grads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import clip_placements

GOOD = ["zero-grad", "backward", "clip", "step"]
LATE = ["clip", "zero-grad", "backward", "step"]


class ClipAfterStep(Signal):
    id = "clip-after-step"
    severities = ("critical",)
    summary = "A clip call runs between an optimizer step and the next backward()."
    reads = frozenset({"events"})
    message = (
        "Clipping ran after optimizer.step() (before the next backward) in {count} step(s), "
        "first before step {step}: the update had already used the unclipped gradients."
    )
    advice = "Move the clip between backward() and optimizer.step()."
    rank = 20
    healthy: ClassVar[list[Example]] = [
        Example("clip between backward and step", None, each={"events": GOOD})
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "clip at the top of the next iteration",
            "critical",
            series={"events": [["zero-grad", "backward", "step"], LATE, LATE]},
            check={"step": 2, "steps_affected": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        after, _ = clip_placements(run)
        if after:
            yield ctx.finding(
                self.id,
                "critical",
                self.message.format(count=len(after), step=after[0]),
                step=after[0],
                fix=self.advice,
                steps_affected=len(after),
            )
