"""amp-overflow-skips: the GradScaler keeps skipping steps after its calibration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events

AMP = ["scale", "backward", "scaler-step", "scaler-update"]
#: Skipped steps at the start that are the GradScaler finding its scale (from 2**16 down a
#: few halvings). More than this in a row is not calibration: a loss summed over elements
#: rather than averaged, or an op that overflows, keeps the scaler halving for many steps.
CALIBRATION_STEPS = 5


class AmpOverflowSkips(Signal):
    id = "amp-overflow-skips"
    severities = ("warning",)
    summary = "More than amp_skip_fraction of steps skipped by the GradScaler after calibration."
    reads = frozenset({"scale", "skipped"})
    optional = frozenset({"events"})
    thresholds = ("amp_skip_fraction",)
    message = (
        "GradScaler skipped {skipped} of {steps} steps after its initial calibration (limit "
        "{limit:.0%}); scale went from {first} to {last}."
    )
    advice = (
        "Find the overflowing operation (run it in fp32 or use bf16), and make sure clipping "
        "runs on unscaled gradients."
    )
    rank = 43
    healthy: ClassVar[list[Example]] = [
        Example(
            "three calibration skips, then none",
            None,
            each={"events": AMP},
            series={
                "skipped": [s <= 3 for s in range(1, 12)],
                "scale": [2.0 ** (16 - s) for s in range(1, 12)],
                "grad_norm": [0.5] * 11,
            },
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "a summed loss: the scaler halves for 14 steps before one update goes through",
            "warning",
            each={"events": AMP},
            series={
                "skipped": [s <= 14 for s in range(1, 21)],
                "scale": [2.0 ** (16 - min(s, 14)) for s in range(1, 21)],
                "grad_norm": [float("inf")] * 14 + [3.0] * 6,
            },
            check={"step": 1, "skipped": 14},
        ),
        Example(
            "every other step skipped",
            "warning",
            each={"events": AMP},
            series={
                "skipped": [s % 2 == 0 for s in range(1, 12)],
                "scale": [2.0 ** (16 - s) for s in range(1, 12)],
                "grad_norm": [0.5] * 11,
            },
            check={"step": 2, "skipped": 5},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        scaled = [
            p
            for p in run.steps
            if p.scale is not None and (p.events is None or "scale" in events(p))
        ]
        if len(scaled) < 4:
            return
        index = 0
        while index < len(scaled) and scaled[index].skipped:
            index += 1  # the scaler calibrates its scale on the first steps
        if index > CALIBRATION_STEPS or index == len(scaled):
            index = 0  # a long run of skips is the problem, not calibration
        rest = scaled[index:]
        skipped = [p for p in rest if p.skipped]
        limit = ctx.threshold("amp_skip_fraction")
        if not rest or len(skipped) / len(rest) <= limit:
            return
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(
                skipped=len(skipped),
                steps=len(rest),
                limit=limit,
                first=evidence_number(scaled[0].scale),
                last=evidence_number(scaled[-1].scale),
            ),
            step=skipped[0].step,
            fix=self.advice,
            skipped=len(skipped),
            steps=len(rest),
            first_scale=scaled[0].scale,
            last_scale=scaled[-1].scale,
            threshold=limit,
        )
