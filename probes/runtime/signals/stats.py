"""Small statistics the signals share (plain Python; no torch, no numpy)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

#: Relative fall of the loss (first third → last third of the run) that counts as improving.
LOSS_IMPROVING = 0.05


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite numbers of ``values``, in order."""
    return [v for v in values if v is not None and math.isfinite(v)]


def is_nonfinite(value: float | None) -> bool:
    """True for NaN and ±Inf (False for None)."""
    return value is not None and not math.isfinite(value)


def rank_correlation(values: Sequence[float]) -> float:
    """Spearman correlation of ``values`` with their position (ties broken by order)."""
    n = len(values)
    if n < 3:
        return 0.0
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0] * n
    for rank, i in enumerate(order):
        ranks[i] = rank
    mean = (n - 1) / 2
    cov = sum((i - mean) * (r - mean) for i, r in enumerate(ranks))
    var = sum((i - mean) ** 2 for i in range(n))
    return cov / var if var else 0.0


def raw_norm(point: StepPoint) -> float | None:
    """The norm the script's own backward produced (before its clipping, if any), in
    unscaled units; None for a step the GradScaler skipped (its overflow is not a norm).

    The probe's child divides every norm by the GradScaler scale the gradients carried when
    measured (a clip before ``unscale_``, a fused optimizer's step, a step that bypassed
    ``scaler.step``), so the recorded values already say what the gradients are.
    """
    if point.skipped:
        return None
    before = point.grad_norm_before_clip
    return before if before is not None else point.grad_norm


def step_loss(point: StepPoint) -> float | None:
    """The step's loss when every loss of the step is finite, else None."""
    if point.losses is not None:
        present = [v for v in point.losses if v is not None]
        if not present or not all(math.isfinite(v) for v in present):
            return None
        return sum(present) / len(present)
    loss = point.loss
    return loss if loss is not None and math.isfinite(loss) else None


def loss_bad(point: StepPoint) -> bool:
    """True when a loss of the step is non-finite."""
    if point.losses is not None:
        return any(is_nonfinite(v) for v in point.losses)
    return is_nonfinite(point.loss)


def grads_bad(point: StepPoint) -> bool:
    """True when the applied gradients were non-finite (a GradScaler-skipped step is not)."""
    return not point.skipped and is_nonfinite(point.grad_norm)


def first_nonfinite(run: RunSeries) -> StepPoint | None:
    """The first step whose inputs, loss, gradients or parameters were non-finite."""
    for point in run.steps:
        if (
            point.inputs_finite is False
            or loss_bad(point)
            or grads_bad(point)
            or point.nonfinite_params
        ):
            return point
    return None


def loss_improving(run: RunSeries) -> bool | None:
    """True when the loss fell by more than 5 % from the first to the last third of the run
    (None: fewer than four finite losses)."""
    losses = [step_loss(p) for p in run.steps]
    values = [v for v in losses if v is not None]
    if len(values) < 4:
        return None
    third = max(1, len(values) // 3)
    first = statistics.fmean(values[:third])
    last = statistics.fmean(values[-third:])
    return first - last > LOSS_IMPROVING * abs(first) + 1e-12


def norm_at(run: RunSeries, step: int) -> float | None:
    """The raw norm of step ``step``, if it was measured."""
    for point in run.steps:
        if point.step == step:
            return raw_norm(point)
    return None


def weight_layer_medians(run: RunSeries) -> tuple[dict[str, float], list[str]]:
    """Median norm per layer over the steps, and the weight layers (in model order) whose
    median is not zero."""
    per_layer: dict[str, list[float]] = {}
    for point in run.steps:
        if point.skipped:
            continue  # a GradScaler-skipped step's overflowed norms were never applied
        for layer, norm in (point.layer_grad_norms or {}).items():
            if math.isfinite(norm):
                per_layer.setdefault(layer, []).append(norm)
    medians = {k: statistics.median(v) for k, v in per_layer.items() if v}
    layers = [layer for layer in run.weight_layers or () if medians.get(layer, 0) > 0]
    return medians, layers


def early_late(run: RunSeries) -> tuple[float | None, str | None, str | None]:
    """Median norm of the last weight layer / the first one, and their names."""
    medians, layers = weight_layer_medians(run)
    if len(layers) < 2:
        return None, None, None
    early, late = layers[0], layers[-1]
    return medians[late] / medians[early], early, late


def names(values: Sequence[str], limit: int) -> str:
    """The first ``limit`` names, comma-separated, with an ellipsis when there are more."""
    return ", ".join(values[:limit]) + ("…" if len(values) > limit else "")
