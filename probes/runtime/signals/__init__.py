"""The runtime signals: one module per catalogue id the runtime diagnosis can report.

Each module defines one :class:`~probes.runtime.signals.base.Signal` subclass: its id, the
fields it reads, its thresholds, its message and advice, and its own healthy and pathological
step series as data. :func:`run_signals` runs every signal whose fields the series has, in
``rank`` order (a signal runs after those it consults), on a
:class:`~probes.runtime.signals.series.RunSeries` built by the probe or from a training log.
Nothing lists the signals by hand: they are discovered.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from gradient_doctor.knowledge.findings import SEVERITY_RANK, Finding
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.result import optimizer_label
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.stats import first_nonfinite

__all__ = [
    "Context",
    "Example",
    "RunSeries",
    "Signal",
    "StepPoint",
    "all_signals",
    "run_signals",
    "signal_ids",
]


@lru_cache(maxsize=1)
def _discover() -> tuple[Signal, ...]:
    found: list[Signal] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Signal)
                and value is not Signal
                and value.__module__ == module.__name__
            ):
                found.append(value())
    return tuple(sorted(found, key=lambda signal: (signal.rank, signal.id)))


def all_signals() -> list[Signal]:
    """Every runtime signal, in run order."""
    return list(_discover())


def signal_ids() -> list[str]:
    """The catalogue ids the runtime signals report."""
    return [signal.id for signal in _discover()]


def run_signals(run: RunSeries, profile: ThresholdProfile) -> list[Finding]:
    """Judge ``run`` with ``profile``: the findings, most severe first (causes first among
    equals). Signals whose fields ``run`` lacks are skipped."""
    available = run.available()
    bad = first_nonfinite(run)
    ctx = Context(profile, bad.step if bad is not None else None)
    finite_run = run.up_to(ctx.first_nonfinite)
    optimizers = finite_run.optimizers()
    rank = {}
    for signal in _discover():
        rank[signal.id] = signal.rank
        if not signal.reads <= available:
            continue
        judged = finite_run if signal.scope == "finite" else run
        if not judged.steps and signal.scope == "finite":
            continue
        if signal.per_optimizer and len(optimizers) > 1:
            for index in optimizers:
                ctx.findings.extend(
                    _for_optimizer(f, index, run)
                    for f in signal.check(judged.for_optimizer(index), ctx)
                )
            continue
        ctx.findings.extend(signal.check(judged, ctx))
    # Most severe first; among equals, causes before consequences (the signals' rank).
    return sorted(
        ctx.findings,
        key=lambda f: (-SEVERITY_RANK[f.severity], rank.get(f.id, 0), f.step or 0),
    )


def _for_optimizer(finding: Finding, index: int, run: RunSeries) -> Finding:
    """A finding judged on one optimizer's steps says which optimizer it is about."""
    kinds = run.optimizer_kinds or []
    kind = kinds[index] if index < len(kinds) else None
    label = optimizer_label(index, kinds, run.optimizer_names)
    names = run.optimizer_names or []
    name = names[index] if index < len(names) else None
    return finding.model_copy(
        update={
            "message": f"[{label}] {finding.message}",
            "evidence": {
                **finding.evidence,
                "optimizer": index,
                "optimizer_kind": kind,
                "optimizer_name": name,
            },
        }
    )
