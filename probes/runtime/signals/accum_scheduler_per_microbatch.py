"""accum-scheduler-per-microbatch: the LR scheduler steps on every micro-batch."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import (
    affected_windows,
    events,
    micro_batches,
)


class AccumSchedulerPerMicrobatch(Signal):
    id = "accum-scheduler-per-microbatch"
    severities = ("warning",)
    summary = "The LR scheduler steps several times per accumulated optimizer step."
    reads = frozenset({"events"})
    message = (
        "The LR scheduler stepped {per_step:g} times per optimizer step (first: step {step}): "
        "the schedule runs {micro:g}× too fast."
    )
    advice = "Step the scheduler once per optimizer step, inside the update branch."
    rank = 33
    healthy: ClassVar[list[Example]] = [
        Example(
            "one scheduler step per update",
            None,
            each={"events": ["backward", "backward", "step", "scheduler", "zero-grad"]},
            series={"loss": [1.0] * 4},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "a scheduler step after every backward",
            "warning",
            each={"events": ["backward", "scheduler", "backward", "scheduler", "step"]},
            series={"loss": [1.0] * 4},
            check={"step": 1, "steps_affected": 4},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = affected_windows(run, lambda p: events(p).count("scheduler") >= 2)
        if found is None:
            return
        windows, scheduling = found
        per_step = statistics.median(events(p).count("scheduler") for p in windows)
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(
                per_step=per_step, step=scheduling[0], micro=micro_batches(windows)
            ),
            step=scheduling[0],
            fix=self.advice,
            steps_affected=len(scheduling),
        )
