"""accum-zero-grad-every-microstep: zero_grad() between the micro-batches of one update."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.windows import (
    affected_windows,
    events,
    last_step_index,
    micro_batches,
)


class AccumZeroGradEveryMicrostep(Signal):
    id = "accum-zero-grad-every-microstep"
    severities = ("critical",)
    summary = "zero_grad() runs between the backward() calls of accumulated steps."
    reads = frozenset({"events"})
    message = (
        "zero_grad() runs between the micro-batches of {count} accumulated step(s) (first: "
        "step {step}): only the last micro-batch's gradient reaches the update."
    )
    advice = "Zero the gradients only after the optimizer step of each update."
    rank = 31
    healthy: ClassVar[list[Example]] = [
        Example(
            "zero_grad once per update",
            None,
            each={"events": ["zero-grad", "backward", "backward", "step"]},
            series={"loss": [1.0] * 4},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "zero_grad before every micro-batch",
            "critical",
            each={"events": ["zero-grad", "backward", "zero-grad", "backward", "step"]},
            series={"loss": [1.0] * 4},
            check={"step": 1, "steps_affected": 4},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        def zeroed_between(point: StepPoint) -> bool:
            calls = events(point)
            return "zero-grad" in calls[calls.index("backward") + 1 : last_step_index(point)]

        found = affected_windows(run, zeroed_between)
        if found is None:
            return
        windows, zeroing = found
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(count=len(zeroing), step=zeroing[0]),
            step=zeroing[0],
            fix=self.advice,
            steps_affected=len(zeroing),
            backward_per_step=micro_batches(windows),
        )
