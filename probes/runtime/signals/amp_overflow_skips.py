"""amp-overflow-skips: the GradScaler keeps skipping steps after its calibration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import loss_bad
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
    every_message = (
        "GradScaler skipped every step{after_first} ({skipped} of {steps}): no update was "
        "applied, and its scale fell from {first} to {last}."
    )
    leading_message = (
        "GradScaler skipped the first {leading} steps in a row (calibration takes a few) and "
        "{skipped} of {steps} in all; scale went from {first} to {last}."
    )
    collapsed_message = (
        " A scale below 1 shrinks the gradients instead of protecting float16's range: they "
        "overflow whatever the scale, so an operation makes them Inf/NaN."
    )
    advice = (
        "Find the overflowing operation (run it in fp32 or use bf16), and make sure clipping "
        "runs on unscaled gradients."
    )
    collapsed_advice = (
        "The gradients are non-finite at any scale, which the GradScaler cannot fix: find the "
        "operation whose backward gives Inf/NaN (sqrt, log or pow at zero, a division by zero, "
        "inf x 0) with torch.autograd.detect_anomaly() or per-module gradient hooks."
    )
    nonfinite_loss_message = (
        " The loss given to backward() was already non-finite on {bad} of these {skipped} "
        "skipped steps: the forward overflowed before any gradient existed, so no loss scale "
        "could help."
    )
    nonfinite_loss_advice = (
        "Fix what made the loss non-finite first (the finding reported with this names it: an "
        "oversized update, a bad batch, the loss computation); the GradScaler only skips the "
        "steps that follow from it."
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
            "scale collapse: every step skipped, the scale halved 40 times (not calibration)",
            "warning",
            each={"events": AMP},
            series={
                "skipped": [True] * 40,
                "scale": [2.0 ** (16 - s) for s in range(40)],
                "grad_norm": [float("nan")] * 40,
            },
            check={"step": 1, "every_step_skipped": True, "scale_collapsed": True},
        ),
        Example(
            "a log without events or norms: the scale falls at every logged step",
            "warning",
            series={
                "skipped": [True] * 8,
                "scale": [2.0 ** (16 - 2 * s) for s in range(8)],
            },
            check={"every_step_skipped": True, "scale_collapsed": False},
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
        leading = 0
        while leading < len(scaled) and scaled[leading].skipped:
            leading += 1  # the scaler calibrates its scale on the first steps
        # Every step skipped (a log's first step is unknown: with no earlier scale, nothing
        # says whether it overflowed).
        every = all(p.skipped for p in scaled[1:])
        # A long run of skips at the start is the problem, not calibration.
        index = 0 if every or leading > CALIBRATION_STEPS else leading
        rest = scaled[index:]
        skipped = [p for p in rest if p.skipped]
        limit = ctx.threshold("amp_skip_fraction")
        if not rest or len(skipped) / len(rest) <= limit:
            return
        first, last = scaled[0].scale, scaled[-1].scale
        assert first is not None and last is not None
        # GradScaler starts at 2**16 and halves on each overflow: below 1 it has given up more
        # than 16 halvings, which no float16 range problem needs.
        collapsed = last < 1.0 and last < first
        numbers = {
            "skipped": len(skipped),
            "steps": len(rest),
            "limit": limit,
            "leading": leading,
            "after_first": "" if scaled[0].skipped else " after the first",
            "first": evidence_number(first),
            "last": evidence_number(last),
        }
        if every:
            message = self.every_message.format(**numbers)
        elif index == 0 and leading:
            message = self.leading_message.format(**numbers)
        else:
            message = self.message.format(**numbers)
        # Skips whose loss was already NaN/Inf: the forward overflowed (weights blown up by
        # the step size, a bad batch), not the float16 gradients the scaler protects.
        bad_loss = sum(1 for p in skipped if loss_bad(p))
        if 2 * bad_loss > len(skipped):
            message += self.nonfinite_loss_message.format(bad=bad_loss, skipped=len(skipped))
            advice = self.nonfinite_loss_advice
        else:
            message += self.collapsed_message if collapsed else ""
            advice = self.collapsed_advice if collapsed else self.advice
        yield ctx.finding(
            self.id,
            "warning",
            message,
            step=skipped[0].step,
            fix=advice,
            skipped=len(skipped),
            steps=len(rest),
            leading_skips=leading,
            every_step_skipped=every,
            scale_collapsed=collapsed,
            first_scale=first,
            last_scale=last,
            threshold=limit,
            nonfinite_loss_skips=bad_loss,
        )
