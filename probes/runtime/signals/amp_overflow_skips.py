"""amp-overflow-skips: the GradScaler keeps skipping steps after its calibration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events

AMP = ["scale", "backward", "scaler-step", "scaler-update"]


class AmpOverflowSkips(Signal):
    id = "amp-overflow-skips"
    severities = ("warning",)
    summary = "More than amp_skip_fraction of steps skipped by the GradScaler after calibration."
    reads = frozenset({"scale", "skipped", "events"})
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
        scaled = [p for p in run.steps if "scale" in events(p) and p.scale is not None]
        if len(scaled) < 4:
            return
        index = 0
        while index < len(scaled) and scaled[index].skipped:
            index += 1  # the scaler calibrates its scale on the first steps
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
