"""nan-loss-before-backward: the loss was already non-finite when backward() received it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite import first_bad, origin_text
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import is_nonfinite, norm_at

NAN = float("nan")


class NanLossBeforeBackward(Signal):
    id = "nan-loss-before-backward"
    severities = ("critical",)
    summary = "The loss given to backward() was already NaN/Inf at the first bad step."
    reads = frozenset({"loss"})
    optional = frozenset(
        {"losses", "grad_norm", "grad_norm_before_clip", "nan_origin", "nonfinite_params"}
    )
    thresholds = ("exploding_critical",)
    message = "The loss given to backward() at step {step} was already {loss}: {cause}."
    advice = (
        "Make the loss numerically safe (epsilon in log/division, clamp, a fused built-in such "
        "as cross_entropy) and check that step's batch."
    )
    rank = 11
    consults = ("nan-parameters",)
    healthy: ClassVar[list[Example]] = [
        Example("finite loss", None, series={"loss": [2.0, 1.8, 1.7, 1.6]})
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "the loss turns NaN at step 3 with calm gradients before",
            "critical",
            series={"loss": [2.0, 1.8, NAN, NAN], "grad_norm": [0.5, 0.5, NAN, NAN]},
            check={"step": 3},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = first_bad(run)
        if found is None or found[0] != "loss":
            return
        point = found[1]
        values = point.losses if point.losses is not None else [point.loss]
        loss = next(v for v in values if is_nonfinite(v))
        previous = norm_at(run, point.step - 1)
        if previous is not None and previous > ctx.threshold("exploding_critical"):
            cause = (
                f"the previous step's gradient norm was {previous:.3g}, so the weights grew "
                "until the loss overflowed: fix the explosion first"
            )
        else:
            cause = "the loss computation is the problem, not the gradients; clipping cannot fix it"
        origin, module = origin_text(run, point.step)
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(step=point.step, loss=evidence_number(loss), cause=cause) + origin,
            step=point.step,
            module=module,
            fix=self.advice,
            loss=loss,
            previous_step_norm=previous,
            origin=run.nan_origin.model_dump() if run.nan_origin else None,
        )
