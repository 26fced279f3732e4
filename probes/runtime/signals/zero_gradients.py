"""zero-gradients: parameter tensors whose gradient was exactly zero (or absent) every step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import names

RUN = {
    "parameters": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "param_layers": ["fc1", "fc1", "fc2", "fc2"],
}


class ZeroGradients(Signal):
    id = "zero-gradients"
    severities = ("warning", "critical")
    summary = "More than zero_grad_fraction_warning of parameter tensors never got a gradient."
    reads = frozenset({"param_grad_norms", "parameters", "grad_norm"})
    optional = frozenset({"param_layers"})
    thresholds = ("zero_grad_fraction_warning", "zero_grad_fraction_critical")
    message = (
        "{count} of {total} parameter tensors ({fraction:.0%}) had an exactly zero (or no) "
        "gradient at every step: {names}."
    )
    advice = (
        "Check for frozen or disconnected parameters (requires_grad, unused layers, detach()) "
        "and for dead ReLU units."
    )
    rank = 53
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "every tensor gets a gradient",
            None,
            each={"param_grad_norms": [0.5, 0.1, 0.4, 0.1], "grad_norm": 0.66},
            series={"loss": [1.0] * 4},
            run=RUN,
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "fc1.bias zero and fc2.bias absent",
            "warning",
            each={"param_grad_norms": [1.0, 0.0, 0.1, None], "grad_norm": 1.0},
            series={"loss": [1.0] * 5},
            run=RUN,
            check={"parameter": "fc1.bias", "module": "fc1", "zero_tensors": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        parameters = run.parameters or []
        if not parameters:
            return
        usable = [
            p.param_grad_norms
            for p in run.steps
            if p.grad_norm is not None and math.isfinite(p.grad_norm) and p.param_grad_norms
        ]
        if not usable:
            return
        zero = [
            i
            for i in range(len(parameters))
            if all(i >= len(norms) or norms[i] is None or norms[i] == 0.0 for norms in usable)
        ]
        fraction = len(zero) / len(parameters)
        warn = ctx.threshold("zero_grad_fraction_warning")
        crit = ctx.threshold("zero_grad_fraction_critical")
        if not zero or fraction <= warn:
            return
        zero_names = [parameters[i] for i in zero]
        layers = run.param_layers or []
        yield ctx.finding(
            self.id,
            "critical" if fraction > crit else "warning",
            self.message.format(
                count=len(zero),
                total=len(parameters),
                fraction=fraction,
                names=names(zero_names, 4),
            ),
            parameter=zero_names[0],
            module=layers[zero[0]] if zero[0] < len(layers) else None,
            fix=self.advice,
            zero_tensors=len(zero),
            tensors=len(parameters),
            fraction=fraction,
            threshold_warning=warn,
            threshold_critical=crit,
        )
