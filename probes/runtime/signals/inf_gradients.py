"""inf-gradients: a gradient holds Inf while the loss was finite; names the first tensor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite_gradients import (
    ADVICE,
    is_inf,
    nonfinite_gradient_findings,
)
from gradient_doctor.probes.runtime.signals.series import RunSeries

INF = float("inf")
RUN = {
    "parameters": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "param_layers": ["fc1", "fc1", "fc2", "fc2"],
}


class InfGradients(Signal):
    id = "inf-gradients"
    severities = ("critical",)
    summary = "Inf in a gradient while the loss was finite; the first parameter is named."
    reads = frozenset({"grad_norm"})
    optional = frozenset(
        {
            "loss",
            "losses",
            "skipped",
            "param_grad_norms",
            "parameters",
            "param_layers",
            "nan_origin",
            "nonfinite_params",
        }
    )
    message = (
        "At step {step} the gradient of `{parameter}` (module `{module}`) holds Inf while the "
        "loss was finite."
    )
    advice = ADVICE
    rank = 13
    consults = ("nan-parameters", "nan-loss-before-backward")
    healthy: ClassVar[list[Example]] = [
        Example("finite gradients", None, each={"loss": 1.0, "grad_norm": 0.5})
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "Inf in fc2.weight's gradient at step 1",
            "critical",
            each={"loss": 1.0, "grad_norm": INF, "param_grad_norms": [0.5, 0.1, INF, 0.1]},
            steps={0: {}},
            run=RUN,
            check={"step": 1, "parameter": "fc2.weight"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        yield from nonfinite_gradient_findings(run, ctx, self.id, "Inf", is_inf)
