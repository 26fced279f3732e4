"""saturating-deep-net: one forward pass runs more than 20 sigmoid/tanh modules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries

SATURATING_DEPTH = 20


class SaturatingDeepNet(Signal):
    id = "saturating-deep-net"
    severities = ("warning",)
    summary = "More than 20 sigmoid/tanh modules in one forward pass."
    reads = frozenset({"saturating_modules"})
    message = (
        "One forward pass ran {count} sigmoid/tanh modules (more than {depth}): saturating "
        "activations this deep shrink gradients layer after layer."
    )
    advice = "Use ReLU/GELU, residual connections and normalisation in deep stacks."
    rank = 70
    healthy: ClassVar[list[Example]] = [
        Example(
            "two tanh layers", None, series={"grad_norm": [0.5] * 3}, run={"saturating_modules": 2}
        )
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "30 sigmoids deep",
            "warning",
            series={"grad_norm": [0.5] * 3},
            run={"saturating_modules": 30},
            check={"saturating_modules": 30},
        )
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        count = run.saturating_modules or 0
        if count > SATURATING_DEPTH:
            yield ctx.finding(
                self.id,
                "warning",
                self.message.format(count=count, depth=SATURATING_DEPTH),
                fix=self.advice,
                saturating_modules=count,
            )
