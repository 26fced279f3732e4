"""Shared readings of the order of calls in each step's window (probe series only).

A step's window is everything after the previous optimizer step up to and including this one,
so a ``zero_grad`` or a clip placed after ``optimizer.step()`` shows up at the start of the next
window.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

#: autograd nodes that mean the loss was divided/multiplied (by 1/N) before backward().
SCALED_LOSS_OPS = frozenset({"DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"})
#: autograd nodes of a raw loss (a reduction or a built-in loss), i.e. not divided by N.
RAW_LOSS_OP = re.compile(r"(Loss|Entropy|Nll|KlDiv|Mean|Sum)\w*Backward\d$")


def events(point: StepPoint) -> list[str]:
    return point.events or []


def clip_placements(run: RunSeries) -> tuple[list[int], list[int]]:
    """Steps whose window clips after the previous step (before its own backward, with no
    ``zero_grad`` in between), and steps that clip before their backward on fresh zeroed
    gradients (or on the first step)."""
    after: list[int] = []
    before: list[int] = []
    for index, point in enumerate(run.steps):
        calls = events(point)
        if "clip" not in calls and "clip-value" not in calls:
            continue
        first_backward = calls.index("backward") if "backward" in calls else len(calls)
        for position, call in enumerate(calls[:first_backward]):
            if call not in ("clip", "clip-value"):
                continue
            zeroed = "zero-grad" in calls[:position]
            if index > 0 and not zeroed:
                after.append(point.step)
            else:
                before.append(point.step)
            break
    return after, before


def is_accumulation(point: StepPoint) -> bool:
    """Two or more backward() calls in the step over two or more batches.

    Several backward() calls on one batch are not accumulation: a GAN's real and fake losses,
    several losses of one model. The batches are counted from DataLoader iterators when the
    script uses one, else from the forwards of the stepped model that took fresh data; a
    series with neither (a log) keeps the backward count alone.
    """
    if events(point).count("backward") < 2:
        return False
    if point.batches is not None:
        return point.batches >= 2
    if point.feeds is not None:
        return point.feeds >= 2
    return True


def accumulated(run: RunSeries) -> list[StepPoint] | None:
    """The accumulated steps (:func:`is_accumulation`) when they are at least half of the
    run, else None."""
    windows = [p for p in run.steps if is_accumulation(p)]
    if not windows or len(windows) * 2 < len(run.steps):
        return None
    return windows


def affected_windows(
    run: RunSeries, affected: Callable[[StepPoint], bool]
) -> tuple[list[StepPoint], list[int]] | None:
    """(the accumulated windows, the steps of those where ``affected`` holds) when it holds in
    at least half of them: a pattern of the loop, not a one-off. None otherwise."""
    windows = accumulated(run)
    if windows is None:
        return None
    steps = [p.step for p in windows if affected(p)]
    if not steps or len(steps) * 2 < len(windows):
        return None
    return windows, steps


def micro_batches(windows: list[StepPoint]) -> float:
    """Median number of backward() calls per accumulated step."""
    return statistics.median(events(p).count("backward") for p in windows)


def last_step_index(point: StepPoint) -> int:
    """Position of the window's optimizer (or scaler) step call."""
    calls = events(point)
    for index in range(len(calls) - 1, -1, -1):
        if calls[index] in ("step", "scaler-step"):
            return index
    return len(calls)
