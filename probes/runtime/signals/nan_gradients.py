"""nan-gradients: a gradient holds NaN while the loss was finite; names the first tensor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite_gradients import (
    ADVICE,
    is_nan,
    nonfinite_gradient_findings,
)
from gradient_doctor.probes.runtime.signals.series import RunSeries

NAN = float("nan")
RUN = {
    "parameters": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "param_layers": ["fc1", "fc1", "fc2", "fc2"],
}


class NanGradients(Signal):
    id = "nan-gradients"
    severities = ("critical",)
    summary = "NaN in a gradient while the loss was finite; the first parameter is named."
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
        "At step {step} the gradient of `{parameter}` (module `{module}`) holds NaN while the "
        "loss was finite."
    )
    advice = ADVICE
    rank = 12
    consults = ("nan-parameters", "nan-loss-before-backward")
    healthy: ClassVar[list[Example]] = [
        Example("finite gradients", None, each={"loss": 1.0, "grad_norm": 0.5})
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "NaN in fc2.weight's gradient at step 2",
            "critical",
            each={"loss": 1.0},
            series={
                "param_grad_norms": [[0.5, 0.1, 0.4, 0.1], [0.5, 0.1, NAN, 0.1]],
                "grad_norm": [0.66, NAN],
            },
            run=RUN,
            check={"step": 2, "parameter": "fc2.weight", "module": "fc2"},
        ),
        Example(
            "a log whose total norm turns NaN",
            "critical",
            series={"loss": [1.0, 0.9, 0.9], "grad_norm": [0.5, 0.4, NAN]},
            check={"step": 3},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        yield from nonfinite_gradient_findings(run, ctx, self.id, "NaN", is_nan)
