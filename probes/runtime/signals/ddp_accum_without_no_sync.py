"""ddp-accum-without-no-sync: DDP all-reduces on every micro-batch of an accumulated step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import accumulated, events, micro_batches

SYNCED = ["forward-ddp-sync", "backward", "forward-ddp-sync", "backward", "step", "zero-grad"]


class DdpAccumWithoutNoSync(Signal):
    id = "ddp-accum-without-no-sync"
    severities = ("warning",)
    summary = "Under DDP, every micro-batch of an accumulated step synchronises gradients."
    reads = frozenset({"events", "ddp"})
    message = (
        "DDP synchronised gradients on every micro-batch of {count} accumulated step(s): "
        "{micro:g} all-reduces per update instead of 1."
    )
    advice = "Wrap all but the last micro-batch's forward/backward in model.no_sync()."
    rank = 34
    healthy: ClassVar[list[Example]] = [
        Example(
            "no_sync on the first micro-batch",
            None,
            each={
                "events": [
                    "forward-ddp-no-sync",
                    "backward",
                    "forward-ddp-sync",
                    "backward",
                    "step",
                    "zero-grad",
                ]
            },
            series={"loss": [1.0] * 4},
            run={"ddp": True},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "every micro-batch synchronised",
            "warning",
            each={"events": SYNCED},
            series={"loss": [1.0] * 4},
            run={"ddp": True},
            check={"step": 1, "steps_affected": 4},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        windows = accumulated(run)
        if windows is None or not run.ddp:
            return
        synced = [p.step for p in windows if events(p).count("forward-ddp-sync") >= 2]
        if synced and len(synced) * 2 >= len(windows):
            yield ctx.finding(
                self.id,
                "warning",
                self.message.format(count=len(synced), micro=micro_batches(windows)),
                step=synced[0],
                fix=self.advice,
                steps_affected=len(synced),
            )
