"""update-param-ratio: the applied update ‖Δw‖/‖w‖ of a layer far from its usual order.

Measured on the update the optimizer really applied (weights sampled before and after the step
on sampled steps), so it holds for Adam-family optimizers too, where ‖g‖/‖w‖ says little.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries


class UpdateParamRatio(Signal):
    id = "update-param-ratio"
    severities = ("warning",)
    summary = (
        "A weight layer's ‖Δw‖/‖w‖ above update_ratio_high (or below update_ratio_low) on every "
        "sampled step after the first."
    )
    reads = frozenset({"update_ratios"})
    optional = frozenset({"lr"})
    thresholds = ("update_ratio_high", "update_ratio_low")
    message = (
        "The update applied to `{layer}` is {ratio:.3g}× its weights' norm at step {step} "
        "({direction}); out of [{low:g}, {high:g}] on all {sampled} sampled steps, {count} "
        "layer(s) affected{lr}."
    )
    advice_high = (
        "The step size is too large for these weights: lower the learning rate (or that "
        "parameter group's) and check the warmup."
    )
    advice_low = (
        "Check that the layer receives gradient and is in the optimizer, then its group's "
        "learning rate and weight decay."
    )
    advice = advice_high
    per_optimizer = True
    rank = 47
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "updates around 1e-3 of the weights",
            None,
            series={
                "update_ratios": [{"fc1": 2e-3, "fc2": 1e-3}, None, {"fc1": 1e-3, "fc2": 8e-4}]
            },
        ),
        Example(
            "one large first update (Adam's first step) is not a pattern",
            None,
            series={"update_ratios": [{"fc1": 3.0}, None, {"fc1": 1e-2}, None, {"fc1": 1e-2}]},
        ),
    ]
    healthy += [
        Example(
            "sampled steps the GradScaler skipped applied no update (a ratio of 0)",
            None,
            series={
                "update_ratios": [{"fc1": 1e-3}, {"fc1": 0.0}, {"fc1": 0.0}],
                "skipped": [False, True, True],
                "scale": [2.0**16, 2.0**16, 2.0**15],
            },
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "every update larger than the weights",
            "warning",
            series={
                "update_ratios": [{"fc1": 4.0, "fc2": 1e-2}, None, {"fc1": 3.0, "fc2": 1e-2}],
                "lr": [0.5, 0.5, 0.5],
            },
            check={"module": "fc1", "step": 3},
        ),
        Example(
            "a layer that never moves",
            "warning",
            series={"update_ratios": [{"fc1": 1e-3, "fc2": 0.0}, {"fc1": 1e-3, "fc2": 1e-9}]},
            check={"module": "fc2"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        # A GradScaler-skipped step applied no update: its ratio of 0 says nothing.
        sampled = [p for p in run.steps if p.update_ratios and not p.skipped]
        if len(sampled) > 1:
            sampled = sampled[1:]  # Adam's first update is ±lr per element: not typical
        if not sampled:
            return
        high = ctx.threshold("update_ratio_high")
        low = ctx.threshold("update_ratio_low")
        last = sampled[-1].update_ratios or {}
        bad: list[tuple[str, float]] = []
        for layer, ratio in last.items():
            history = [(p.update_ratios or {}).get(layer) for p in sampled]
            if all(r is not None and (r > high or r < low) for r in history):
                bad.append((layer, ratio))
        if not bad:
            return
        layer, ratio = max(bad, key=lambda item: abs(math.log10(max(item[1], 1e-30))))
        too_large = ratio > high
        lr = sampled[-1].lr
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(
                layer=layer,
                ratio=ratio,
                step=sampled[-1].step,
                direction="steps too large for the weights"
                if too_large
                else "the layer barely moves",
                low=low,
                high=high,
                sampled=len(sampled),
                count=len(bad),
                lr=f"; learning rate {lr:.3g}" if lr is not None else "",
            ),
            step=sampled[-1].step,
            module=layer,
            fix=self.advice_high if too_large else self.advice_low,
            ratio=ratio,
            layers_outside=len(bad),
            sampled_steps=len(sampled),
            threshold_high=high,
            threshold_low=low,
            lr=lr,
        )
