"""nan-parameters: the weights were already non-finite before the step's forward pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite import first_bad, origin_text
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import names, norm_at


class NanParameters(Signal):
    id = "nan-parameters"
    severities = ("critical",)
    summary = "Parameters were non-finite before the forward pass of the first bad step."
    reads = frozenset({"nonfinite_params"})
    optional = frozenset({"grad_norm", "grad_norm_before_clip", "nan_origin"})
    message = (
        "At step {step} the parameters were already non-finite before the forward pass "
        "({names}): an earlier update broke them, the non-finite loss is a consequence."
    )
    advice = (
        "Clip gradients before the step and check the update that preceded it (learning rate, "
        "optimizer eps, divisions in the update)."
    )
    rank = 10
    healthy: ClassVar[list[Example]] = [
        Example("finite weights throughout", None, each={"loss": 1.0, "grad_norm": 0.5}),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "weights turn NaN after step 2",
            "critical",
            each={"grad_norm": 0.5, "loss": 1.0},
            steps={2: {"loss": float("nan"), "nonfinite_params": ["fc1.weight"]}},
            check={"step": 3, "parameter": "fc1.weight", "nonfinite_parameters": 1},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = first_bad(run)
        if found is None or found[0] != "parameters":
            return
        point = found[1]
        bad = point.nonfinite_params or []
        origin, _ = origin_text(run, point.step)
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(step=point.step, names=names(bad, 3)) + origin,
            step=point.step,
            parameter=bad[0],
            module=bad[0].rsplit(".", 1)[0] if "." in bad[0] else None,
            fix=self.advice,
            nonfinite_parameters=len(bad),
            previous_step_norm=norm_at(run, point.step - 1),
        )
