"""What the probe saw of the learning rate, in the words both step-size signals use.

``loss-diverging`` and ``update-param-ratio`` both blame a step size that is too large; the
finding names the rate and the warmup seen and the advice gives a concrete lower value, so the
user reads the same story whichever of the two noticed the problem first.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

if TYPE_CHECKING:
    from gradient_doctor.probes.runtime.signals.base import Context


def lr_story(points: list[StepPoint]) -> tuple[str, dict[str, float | int | None]]:
    """What the learning rate did over ``points``: a sentence and the numbers."""
    rates = [(p.step, p.lr) for p in points if p.lr is not None]
    if not rates:
        return "learning rate not seen (no optimizer's param_groups, e.g. a hand-written update)", {
            "lr": None
        }
    first_lr = rates[0][1]
    peak_step, peak = max(rates, key=lambda item: item[1] or 0.0)
    last_lr = rates[-1][1]
    numbers: dict[str, float | int | None] = {"lr": peak, "lr_first": first_lr, "lr_last": last_lr}
    if peak is not None and first_lr is not None and peak > first_lr * 1.01:
        warmup = peak_step - rates[0][0] + 1
        numbers["warmup_steps"] = warmup
        return (
            f"learning rate {first_lr:.3g} → {peak:.3g} (a warmup of {warmup} step(s), peak at "
            f"step {peak_step}), {last_lr:.3g} at the end",
            numbers,
        )
    numbers["warmup_steps"] = 0
    return f"learning rate {peak:.3g} from the first measured step on: no warmup seen", numbers


def sentence(story: str) -> str:
    """``story`` as a sentence of its own."""
    return story[0].upper() + story[1:]


def lower_lr_hint(numbers: dict[str, float | int | None]) -> str:
    """A concrete lower peak rate to try (a tenth of the one seen), or nothing when no rate
    was seen."""
    peak = numbers.get("lr")
    if not peak:
        return ""
    return f" (try {float(peak) / 10:.2g}, a tenth of {float(peak):.3g})"


@dataclass(frozen=True)
class Blowup:
    """An update far too large for the weights, seen before the loss went non-finite."""

    step: int
    """The sampled step whose update (or whose weights) showed it."""
    layer: str
    """The weight layer with the largest ratio (or growth)."""
    factor: float
    """That layer's ‖Δw‖/‖w‖ (kind ``update``) or weight growth (kind ``growth``)."""
    median: float
    """The median of the same number over the weight layers."""
    above: int
    layers: int
    kind: str  # "update" or "growth"

    def text(self) -> str:
        """``the update at step 1 was 117× the weights' norm in `fc1` (median 3.2× over 10
        weight layers, 9 above 1)``."""
        if self.kind == "update":
            return (
                f"the update applied at step {self.step} was {self.factor:.3g}× the weights' "
                f"norm in `{self.layer}` ({self.above} of {self.layers} weight layers took an "
                f"update larger than their weights, median {self.median:.3g}×)"
            )
        return (
            f"the weights grew {self.median:.3g}× by step {self.step} (median over "
            f"{self.layers} weight layers, {self.above} above the limit; `{self.layer}` "
            f"{self.factor:.3g}×)"
        )


def _weight_norms(run: RunSeries, point: StepPoint) -> dict[str, float]:
    """L2 weight norm per weight layer on one sampled step."""
    weight_layers = set(run.weight_layers or ())
    sums: dict[str, float] = {}
    for layer, norm in zip(run.param_layers or [], point.param_norms or [], strict=False):
        if norm is not None and layer in weight_layers:
            sums[layer] = sums.get(layer, 0.0) + norm * norm
    return {layer: math.sqrt(total) for layer, total in sums.items()}


def blowup_before(run: RunSeries, step: int, ctx: Context) -> Blowup | None:
    """Whether the step size, not the loss computation, made the loss non-finite at ``step``:
    the last sampled update before it was larger than the weights in most weight layers
    (above update_ratio_high, where healthy runs sit near 1e-3), or the weights' norms grew
    more than weight_growth_high times in most weight layers between the first sampled step
    and ``step``. Most means more than half, as in ``update-param-ratio``: one layer alone
    may be a zero-initialised or tiny one whose ratio says little."""
    kinds = run.optimizer_kinds or []
    updates = [p for p in run.steps if p.step < step and p.update_ratios and not p.skipped]
    if updates:
        point = updates[-1]
        if point.optimizer < len(kinds) and kinds[point.optimizer] == "LBFGS":
            return None  # its step length comes from a line search, not a learning rate
        ratios = {k: v for k, v in (point.update_ratios or {}).items() if math.isfinite(v)}
        high = ctx.threshold("update_ratio_high")
        above = [layer for layer, ratio in ratios.items() if ratio > high]
        if ratios and 2 * len(above) > len(ratios):
            layer = max(ratios, key=lambda name: ratios[name])
            return Blowup(
                step=point.step,
                layer=layer,
                factor=ratios[layer],
                median=statistics.median(ratios.values()),
                above=len(above),
                layers=len(ratios),
                kind="update",
            )
    sampled = [p for p in run.steps if p.step <= step and p.param_norms]
    if len(sampled) < 2:
        return None
    before, after = _weight_norms(run, sampled[0]), _weight_norms(run, sampled[-1])
    growth = {
        layer: after[layer] / norm
        for layer, norm in before.items()
        if norm > 0 and layer in after and math.isfinite(after[layer])
    }
    limit = ctx.threshold("weight_growth_high")
    grown = [layer for layer, factor in growth.items() if factor > limit]
    if len(growth) < 2 or 2 * len(grown) <= len(growth):
        return None
    layer = max(growth, key=lambda name: growth[name])
    return Blowup(
        step=sampled[-1].step,
        layer=layer,
        factor=growth[layer],
        median=statistics.median(growth.values()),
        above=len(grown),
        layers=len(growth),
        kind="growth",
    )


def nan_loss_from_step_size(run: RunSeries, ctx: Context) -> tuple[StepPoint, Blowup] | None:
    """The first non-finite loss and the oversized update before it, when the step size is
    the cause (:func:`blowup_before`): ``loss-diverging`` then reports it with advice that
    starts with the learning rate, and ``nan-loss-before-backward``, whose advice is about the
    loss computation, stands down. Single-objective runs only, as ``loss-diverging`` judges
    (None otherwise)."""
    from gradient_doctor.probes.runtime.signals.nonfinite import first_bad

    found = first_bad(run)
    if found is None or found[0] != "loss" or len(run.optimizers()) > 1:
        return None
    blowup = blowup_before(run, found[1].step, ctx)
    return (found[1], blowup) if blowup is not None else None
