"""Shared reading for nan-gradients / inf-gradients: which gradients went non-finite first."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context
from gradient_doctor.probes.runtime.signals.nonfinite import first_bad, origin_text
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import finite

ADVICE = (
    "Find the operation whose backward is unbounded (sqrt/log/division at 0, overflow in low "
    "precision) and make it safe; with AMP, unscale before clipping."
)


def nonfinite_gradient_findings(
    run: RunSeries,
    ctx: Context,
    entry_id: str,
    kind: str,
    is_kind: Callable[[float], bool],
) -> Iterator[Finding]:
    """The finding of ``entry_id`` when the first bad step's gradients hold ``kind`` values."""
    found = first_bad(run)
    if found is None or found[0] != "gradients":
        return
    point = found[1]
    origin, origin_module = origin_text(run, point.step)
    losses = finite(point.losses if point.losses is not None else [point.loss])
    loss_text = f" ({losses[0]:.4g})" if losses else ""
    parameters = run.parameters or []
    layers = run.param_layers or []
    if point.param_grad_norms is not None and parameters:
        bad = [
            (name, layer)
            for name, layer, norm in zip(parameters, layers, point.param_grad_norms, strict=False)
            if norm is not None and is_kind(norm)
        ]
        if not bad:
            return
        name, layer = bad[0]
        yield ctx.finding(
            entry_id,
            "critical",
            f"At step {point.step} the gradient of `{name}` (module `{layer}`) holds {kind} "
            f"while the loss was finite{loss_text}; {len(bad)} of {len(parameters)} parameter "
            "tensors affected." + origin,
            step=point.step,
            parameter=name,
            module=origin_module or layer,
            fix=ADVICE,
            affected=len(bad),
            first_parameter=name,
            loss=losses[0] if losses else None,
        )
        return
    # Only the total norm is known (a training log): say what it shows, name no tensor.
    if point.grad_norm is None or not is_kind(point.grad_norm):
        return
    yield ctx.finding(
        entry_id,
        "critical",
        f"At step {point.step} the total gradient norm was {kind} while the loss was "
        f"finite{loss_text}." + origin,
        step=point.step,
        module=origin_module,
        fix=ADVICE,
        loss=losses[0] if losses else None,
    )


def is_nan(value: float) -> bool:
    return math.isnan(value)


def is_inf(value: float) -> bool:
    return math.isinf(value)
