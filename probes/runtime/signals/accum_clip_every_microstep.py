"""accum-clip-every-microstep: each micro-batch's partial gradient is clipped."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import affected_windows, events


class AccumClipEveryMicrostep(Signal):
    id = "accum-clip-every-microstep"
    severities = ("warning",)
    summary = "Clipping runs after every backward() of accumulated steps."
    reads = frozenset({"events"})
    message = (
        "Gradients were clipped {clips:g} times per accumulated step (first: step {step}): "
        "each clip sees a partial gradient."
    )
    advice = "Clip once, after the last micro-batch's backward() and before the step."
    rank = 32
    healthy: ClassVar[list[Example]] = [
        Example(
            "one clip per update",
            None,
            each={"events": ["zero-grad", "backward", "backward", "clip", "step"]},
            series={"loss": [1.0] * 4},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "a clip after every backward",
            "warning",
            each={"events": ["zero-grad", "backward", "clip", "backward", "clip", "step"]},
            series={"loss": [1.0] * 4},
            check={"step": 1, "steps_affected": 4},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = affected_windows(run, lambda p: events(p).count("clip") >= 2)
        if found is None:
            return
        windows, clipping = found
        clips = statistics.median(events(p).count("clip") for p in windows)
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(clips=clips, step=clipping[0]),
            step=clipping[0],
            fix=self.advice,
            steps_affected=len(clipping),
        )
