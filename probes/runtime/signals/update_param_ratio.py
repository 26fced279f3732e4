"""update-param-ratio: the applied update ‖Δw‖/‖w‖ of a layer far from its usual order.

Measured on the update the optimizer really applied (weights sampled before and after the step
on sampled steps), so it holds for Adam-family optimizers too, where ‖g‖/‖w‖ says little.

The updates' sum counts too: when most weight layers' norms grew more than weight_growth_high
times between the first and the last sampled step, the steps were far too large for the
weights even if no single sampled step shows it. This is how a learning rate 100x too high
shows in Transformers and LSTMs whose loss does not climb (LayerNorm makes the loss blind to
the weights' scale: the weights balloon, the effective step shrinks, and the loss stalls on a
plateau instead of diverging): nanoGPT at 4 layers x 128 with lr 0.1 grows its weight layers
17x in 30 steps (median) and plateaus at loss 2.5 after 300 steps where lr 1e-3 reaches 0.37.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import UPDATE_INFLATING, Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.step_size import lower_lr_hint, lr_story, sentence

#: Optimizers whose step length comes from a curvature estimate and a line search: weights may
#: move far from a small initialisation in a few steps by design.
SECOND_ORDER = frozenset({"LBFGS"})


class UpdateParamRatio(Signal):
    id = "update-param-ratio"
    severities = ("warning",)
    summary = (
        "A weight layer's ‖Δw‖/‖w‖ above update_ratio_high (or below update_ratio_low) on every "
        "sampled step after the first."
    )
    reads = frozenset({"update_ratios"})
    optional = frozenset({"lr", "param_norms", "param_layers", "weight_layers"})
    thresholds = ("update_ratio_high", "update_ratio_low", "weight_growth_high")
    growth_message = (
        "The weights grew {median:.3g}× (median over {count} of {layers} weight layers above "
        "{limit:g}×; `{layer}` {largest:.3g}×) between steps {first} and {last}: the updates "
        "were far too large for the weights.{lr}"
    )
    message = (
        "The update applied to `{layer}` is {ratio:.3g}× its weights' norm at step {step} "
        "({direction}); out of [{low:g}, {high:g}] on all {sampled} sampled steps, {count} "
        "layer(s) affected.{lr}"
    )
    advice_high = (
        "The step size is too large for these weights: lower the peak learning rate{lower} and "
        "warm it up over a few hundred steps (where only some layers are affected, their "
        "parameter group's rate); clipping does not fix a step size that is too large."
    )
    advice_low = (
        "Check that the layer receives gradient and is in the optimizer, then its group's "
        "learning rate and weight decay."
    )
    advice = advice_high.format(lower="")
    per_optimizer = True
    rank = 47
    consults = tuple(UPDATE_INFLATING)
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
            "weights that grow a little over the run (healthy: 1.0-1.1x, one layer 1.8x)",
            None,
            series={
                "update_ratios": [{"fc1": 1e-2, "fc2": 1e-2}, None, {"fc1": 1e-2, "fc2": 1e-2}],
                "param_norms": [[2.0, 0.1, 1.0, 0.1], None, [2.1, 0.1, 1.8, 0.1]],
            },
            run={
                "param_layers": ["fc1", "fc1", "fc2", "fc2"],
                "weight_layers": ["fc1", "fc2"],
            },
        ),
        Example(
            "LBFGS moves small initial weights far in a few steps by design",
            None,
            series={
                "update_ratios": [{"fc1": 0.5, "fc2": 0.5}, None, {"fc1": 0.2, "fc2": 0.2}],
                "param_norms": [[0.5, 0.1, 0.3, 0.1], None, [4.0, 0.1, 3.0, 0.1]],
            },
            run={
                "param_layers": ["fc1", "fc1", "fc2", "fc2"],
                "weight_layers": ["fc1", "fc2"],
                "optimizer_kinds": ["LBFGS"],
            },
        ),
        Example(
            "a classifier head whose weights grow as the loss falls, the body steady (1 of 2)",
            None,
            series={
                "update_ratios": [{"lstm": 1e-2, "head": 3e-2}, None, {"lstm": 1e-3, "head": 1e-2}],
                "param_norms": [[5.0, 0.1, 0.6, 0.1], None, [5.6, 0.1, 5.3, 0.3]],
                "lr": [2.0, 2.0, 2.0],
            },
            run={
                "param_layers": ["lstm", "lstm", "head", "head"],
                "weight_layers": ["lstm", "head"],
            },
        ),
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
            "LR x100 under LayerNorm: weights balloon 17x while the later updates look small",
            "warning",
            series={
                "update_ratios": [
                    {"h0.attn": 1.29, "h0.mlp": 1.29, "h1.attn": 1.29},
                    {"h0.attn": 0.16, "h0.mlp": 0.14, "h1.attn": 0.15},
                    {"h0.attn": 0.03, "h0.mlp": 0.02, "h1.attn": 0.02},
                ],
                "param_norms": [[2.6, 2.6, 2.6], [30.0, 25.0, 40.0], [44.0, 35.0, 60.0]],
                "lr": [0.009, 0.1, 0.1],
            },
            run={
                "param_layers": ["h0.attn", "h0.mlp", "h1.attn"],
                "weight_layers": ["h0.attn", "h0.mlp", "h1.attn"],
            },
            check={"module": "h1.attn", "step": 3, "layers_grown": 3},
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
        grown = self._growth(run, ctx)
        if grown is not None:
            yield grown
            return
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
        story, numbers = lr_story([p for p in run.steps if not p.skipped])
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
                lr=f" {sentence(story)}." if lr is not None else "",
            ),
            step=sampled[-1].step,
            module=layer,
            fix=ctx.step_size_advice(self.advice_high.format(lower=lower_lr_hint(numbers)))
            if too_large
            else self.advice_low,
            ratio=ratio,
            layers_outside=len(bad),
            sampled_steps=len(sampled),
            threshold_high=high,
            threshold_low=low,
            lr=lr,
        )

    def _growth(self, run: RunSeries, ctx: Context) -> Finding | None:
        """The warning for weights whose norms grew weight_growth_high times or more in most
        weight layers between the first and the last sampled step (None: they did not)."""
        weight_layers = set(run.weight_layers or ())
        sampled = [p for p in run.steps if p.param_norms]
        if len(sampled) < 2 or not run.param_layers or not weight_layers:
            return None
        first, last = sampled[0], sampled[-1]
        kinds = run.optimizer_kinds or []
        if first.optimizer < len(kinds) and kinds[first.optimizer] in SECOND_ORDER:
            return None  # its step is set by curvature, not by a learning rate
        before = _layer_norms(run.param_layers, first.param_norms or [], weight_layers)
        after = _layer_norms(run.param_layers, last.param_norms or [], weight_layers)
        growth = {
            layer: after[layer] / norm
            for layer, norm in before.items()
            if norm > 0 and layer in after and math.isfinite(after[layer])
        }
        if len(growth) < 2:
            return None
        limit = ctx.threshold("weight_growth_high")
        above = [layer for layer, factor in growth.items() if factor > limit]
        # Most means more than half: one grown layer of two is a classifier head whose logits
        # grow as the loss falls (the bundled example once patched: head 8.8x, loss near 0).
        if 2 * len(above) <= len(growth):
            return None
        factors = sorted(growth.values())
        median = factors[len(factors) // 2]
        layer = max(growth, key=lambda name: growth[name])
        lr = last.lr
        story, numbers = lr_story([p for p in run.steps if not p.skipped])
        return ctx.finding(
            self.id,
            "warning",
            self.growth_message.format(
                median=median,
                count=len(above),
                layers=len(growth),
                limit=limit,
                layer=layer,
                largest=growth[layer],
                first=first.step,
                last=last.step,
                lr=f" {sentence(story)}." if lr is not None else "",
            ),
            step=last.step,
            module=layer,
            fix=ctx.step_size_advice(self.advice_high.format(lower=lower_lr_hint(numbers))),
            weight_growth=median,
            layers_grown=len(above),
            weight_layers=len(growth),
            threshold_growth=limit,
            lr=lr,
        )


def _layer_norms(
    param_layers: list[str], norms: list[float | None], weight_layers: set[str]
) -> dict[str, float]:
    """L2 weight norm per weight layer (over its parameters) on one sampled step."""
    sums: dict[str, float] = {}
    for layer, norm in zip(param_layers, norms, strict=False):
        if norm is not None and layer in weight_layers:
            sums[layer] = sums.get(layer, 0.0) + norm * norm
    return {layer: math.sqrt(total) for layer, total in sums.items()}
