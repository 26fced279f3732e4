"""amp-double-unscale: scaler.unscale_ called twice for one optimizer step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events


class AmpDoubleUnscale(Signal):
    id = "amp-double-unscale"
    severities = ("warning",)
    summary = "scaler.unscale_(optimizer) called twice before one update (torch raises)."
    reads = frozenset({"double_unscale"})
    optional = frozenset({"events"})
    message = (
        "scaler.unscale_(optimizer) was called twice for one optimizer step (step {step}); "
        "PyTorch raises a RuntimeError on the second call."
    )
    advice = "Call unscale_ once per optimizer step, right before the clip."
    rank = 42
    healthy: ClassVar[list[Example]] = [
        Example(
            "one unscale_ per step",
            None,
            each={"events": ["scale", "backward", "unscale", "clip", "scaler-step", "step"]},
            series={"grad_norm": [0.5, 0.5]},
            run={"double_unscale": 0},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "the script died on the second unscale_ before any step",
            "warning",
            run={"double_unscale": 1, "status": "script-error"},
            length=0,
            check={"step": 1, "occurrences": 1},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        double = [p.step for p in run.steps if events(p).count("unscale") >= 2]
        crashes = run.double_unscale or 0
        if not (double or crashes):
            return
        first = double[0] if double else len(run.steps) + 1
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(step=first),
            step=first,
            fix=self.advice,
            occurrences=max(len(double), crashes),
        )
