"""grad-param-ratio: ‖g‖/‖w‖ of a weight layer out of range on every sampled step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

RUN = {
    "parameters": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "param_layers": ["fc1", "fc1", "fc2", "fc2"],
    "weight_layers": ["fc1", "fc2"],
}


def layer_ratios(run: RunSeries, point: StepPoint) -> dict[str, float]:
    """‖g‖/‖w‖ per weight layer on a sampled step (L2 over the layer's parameters)."""
    grads: dict[str, float] = {}
    weights: dict[str, float] = {}
    for layer, weight, norm in zip(
        run.param_layers or [], point.param_norms or [], point.param_grad_norms or [], strict=False
    ):
        if weight is None or norm is None:
            continue
        grads[layer] = grads.get(layer, 0.0) + norm * norm
        weights[layer] = weights.get(layer, 0.0) + weight**2
    ratios = {}
    for layer in run.weight_layers or []:
        g, w = math.sqrt(grads.get(layer, 0.0)), math.sqrt(weights.get(layer, 0.0))
        if g > 0 and w > 0:
            ratios[layer] = g / w
    return ratios


class GradParamRatio(Signal):
    id = "grad-param-ratio"
    severities = ("warning",)
    summary = "A weight layer's ‖g‖/‖w‖ is outside the profile's range on every sampled step."
    reads = frozenset({"param_grad_norms", "param_norms", "param_layers", "weight_layers"})
    optional = frozenset({"optimizer_kinds"})
    thresholds = ("grad_param_ratio_high", "grad_param_ratio_low")
    consults = ("loss-diverging",)
    #: ‖g‖/‖w‖ is the size of the update only for plain gradient steps; Adam-family
    #: optimizers normalise each element (their update size is update-param-ratio's).
    sgd_like = frozenset({"SGD", "ASGD", "manual"})
    message = (
        "‖g‖/‖w‖ of `{layer}` is {ratio:.3g} at step {step} ({direction}), out of [{low:g}, "
        "{high:g}] on all {sampled} sampled steps; {count} layer(s) affected."
    )
    advice = (
        "Too large: lower the learning rate or clip; too small: fix gradient flow (activations, "
        "init, normalisation)."
    )
    rank = 54
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "ratios around 1e-2",
            None,
            each={
                "param_grad_norms": [0.01, 0.001, 0.01, 0.001],
                "param_norms": [1.0, 0.1, 1.0, 0.1],
                "grad_norm": 0.014,
            },
            series={"loss": [1.0, 0.9]},
            run=RUN,
        ),
    ]
    healthy += [
        Example(
            "the same ratios under Adam say nothing",
            None,
            each={
                "param_grad_norms": [0.5, 0.1, 0.4, 0.1],
                "param_norms": [1e-3, 1e-3, 1e-3, 1e-3],
                "grad_norm": 0.66,
            },
            series={"loss": [1.0, 0.9]},
            run={**RUN, "optimizer_kinds": ["AdamW"]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "gradients 500x the weights",
            "warning",
            each={
                "param_grad_norms": [0.5, 0.1, 0.4, 0.1],
                "param_norms": [1e-3, 1e-3, 1e-3, 1e-3],
                "grad_norm": 0.66,
            },
            series={"loss": [1.0, 0.9]},
            run=RUN,
            check={"sampled_steps": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        if ctx.has("loss-diverging"):
            return  # the divergence finding already names the step size
        kinds = run.optimizer_kinds
        if kinds is not None:
            run = run.model_copy(
                update={
                    "steps": [
                        p
                        for p in run.steps
                        if p.optimizer < len(kinds) and kinds[p.optimizer] in self.sgd_like
                    ]
                }
            )
        # A GradScaler-skipped step's gradients overflowed and were not applied.
        sampled = [p for p in run.steps if p.param_norms and not p.skipped]
        if not sampled:
            return
        high = ctx.threshold("grad_param_ratio_high")
        low = ctx.threshold("grad_param_ratio_low")
        per_step = [layer_ratios(run, p) for p in sampled]
        # A layer is reported when its ratio is out of range on every sampled step: one
        # sample of a small layer at initialisation is not a pattern.
        bad: list[tuple[str, float]] = []
        for layer, ratio in per_step[-1].items():
            history = [ratios.get(layer) for ratios in per_step]
            if all(r is not None and (r > high or r < low) for r in history):
                bad.append((layer, ratio))
        if not bad:
            return
        point = sampled[-1]
        layer, ratio = max(bad, key=lambda item: abs(math.log10(item[1])))
        direction = "too large (updates swamp the weights)" if ratio > high else "too small"
        yield ctx.finding(
            self.id,
            "warning",
            self.message.format(
                layer=layer,
                ratio=ratio,
                step=point.step,
                direction=direction,
                low=low,
                high=high,
                sampled=len(sampled),
                count=len(bad),
            ),
            step=point.step,
            module=layer,
            fix=self.advice,
            ratio=ratio,
            layers_outside=len(bad),
            sampled_steps=len(sampled),
            threshold_high=high,
            threshold_low=low,
        )
