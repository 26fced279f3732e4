"""nonfinite-inputs: a batch entering the model's forward already held NaN/Inf."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite import first_bad
from gradient_doctor.probes.runtime.signals.series import RunSeries

NAN = float("nan")


class NonfiniteInputs(Signal):
    id = "nonfinite-inputs"
    severities = ("critical",)
    summary = "The first non-finite step's forward received a batch that held NaN/Inf."
    reads = frozenset({"inputs_finite"})
    optional = frozenset({"loss", "losses", "grad_norm", "nonfinite_params"})
    message = (
        "At step {step} a batch given to the model's forward already held NaN/Inf, while the "
        "weights were still finite: the data pipeline is the origin. The {followed} only "
        "followed from it."
    )
    advice = (
        "Find the corrupt sample(s) in that step's batch (or the transform that makes them) and "
        "repair or drop them; keep a cheap torch.isfinite check on each batch. A lower learning "
        "rate, clipping or a stabler loss cannot fix a NaN that arrives with the data."
    )
    rank = 9
    healthy: ClassVar[list[Example]] = [
        Example(
            "finite batches",
            None,
            each={"inputs_finite": True},
            series={"loss": [2.0, 1.8, 1.7, 1.6]},
        ),
        Example(
            "a NaN loss from finite inputs is not the data's fault",
            None,
            each={"inputs_finite": True},
            series={"loss": [2.0, 1.8, NAN, NAN]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "one corrupt batch at step 3",
            "critical",
            series={
                "inputs_finite": [True, True, False, True],
                "loss": [2.0, 1.8, NAN, NAN],
                "grad_norm": [0.5, 0.5, NAN, NAN],
            },
            check={"step": 3},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = first_bad(run)
        if found is None or found[0] != "inputs":
            return
        point = found[1]
        followed = [
            what
            for what, bad in (
                ("non-finite loss", point.loss is not None and point.loss != point.loss),
                (
                    "non-finite gradients",
                    point.grad_norm is not None and point.grad_norm != point.grad_norm,
                ),
            )
            if bad
        ]
        origin = run.nan_origin
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(
                step=point.step,
                followed=" and ".join(followed) if followed else "NaN values that came after",
            ),
            step=point.step,
            module=origin.module if origin is not None and origin.step == point.step else None,
            fix=self.advice,
            loss=point.loss,
        )
