"""Shared reading of the first non-finite step (the NaN diagnostic order), for the NaN signals.

GM's order ("when clipping doesn't fix NaN"), applied at the first step where anything was
non-finite, following the data through one iteration: a batch entering the model's forward
that already held NaN/Inf → ``nonfinite-inputs`` (the data pipeline is the origin); else
parameters already non-finite before that step's forward, i.e. broken by the previous update →
``nan-parameters`` (the non-finite loss is then their consequence); else a non-finite loss
given to ``backward()`` → ``nan-loss-before-backward``; else non-finite gradients →
``nan-gradients`` / ``inf-gradients``. Exactly one of these kinds applies to a run.
"""

from __future__ import annotations

from typing import Literal

from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.stats import first_nonfinite, loss_bad

Kind = Literal["inputs", "parameters", "loss", "gradients"]


def first_bad(run: RunSeries) -> tuple[Kind, StepPoint] | None:
    """What went non-finite first, and at which step."""
    point = first_nonfinite(run)
    if point is None:
        return None
    if point.inputs_finite is False:
        return "inputs", point
    if point.nonfinite_params:
        return "parameters", point
    if loss_bad(point):
        return "loss", point
    return "gradients", point


def origin_text(run: RunSeries, step: int) -> tuple[str, str | None]:
    """The probe's trace of the first non-finite value, as a sentence, and its module."""
    origin = run.nan_origin
    if origin is not None and origin.step == step:
        return f" Origin: {origin.detail}.", origin.module
    if origin is not None:
        return f" Traced at step {origin.step}, after it: {origin.detail}.", None
    return "", None
