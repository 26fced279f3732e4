"""Tests generated from the runtime signals' own examples (no torch, no subprocess).

Every signal module carries healthy and pathological step series as data; each becomes a test
here, run through the whole diagnosis (so the signals a signal consults run too). A second
family checks the contract the log reader relies on: a signal judges with only the fields it
declares, and a series that lacks them is skipped, not misjudged.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.signals import (
    Example,
    RunSeries,
    Signal,
    StepPoint,
    all_signals,
    run_signals,
)
from gradient_doctor.probes.runtime.signals.series import RUN_FIELDS

SIGNALS = all_signals()
HEALTHY = [(s, e) for s in SIGNALS for e in s.healthy]
PATHOLOGICAL = [(s, e) for s in SIGNALS for e in s.pathological]


def _id(value: Any) -> str:
    if isinstance(value, Signal):
        return value.id
    if isinstance(value, Example):
        return value.name.replace(" ", "-")
    return str(value)


def profile_for(example: Example) -> ThresholdProfile:
    return load_knowledge().thresholds.profile(example.profile)


def findings_of(signal: Signal, run: RunSeries, example: Example) -> list[Finding]:
    return [f for f in run_signals(run, profile_for(example)) if f.id == signal.id]


def only_declared(signal: Signal, run: RunSeries) -> RunSeries:
    """``run`` with every field the signal does not declare (reads or optional) removed."""
    keep = signal.reads | signal.optional
    points = [
        StepPoint.model_validate(
            {k: v for k, v in p.model_dump().items() if k == "step" or k in keep}
        )
        for p in run.steps
    ]
    run_level = {k: getattr(run, k) for k in RUN_FIELDS if k in keep}
    return RunSeries(source="log", status=run.status, steps=points, **run_level)


def test_signal_ids_are_unique_catalogue_ids_with_catalogue_severities() -> None:
    knowledge = load_knowledge()
    ids = [s.id for s in SIGNALS]
    assert len(ids) == len(set(ids))
    for signal in SIGNALS:
        entry = knowledge.get(signal.id)
        assert entry.kind in ("signal", "red-flag"), signal.id
        catalogue = set(getattr(entry, "severities", None) or [entry.severity_or_none])
        assert catalogue <= set(signal.severities), signal.id
        # A signal may say less than the catalogue (info), never more.
        assert set(signal.severities) - catalogue <= {"info"}, signal.id
        if entry.kind == "red-flag":
            assert "R" in entry.where, signal.id


@pytest.mark.parametrize("signal", SIGNALS, ids=_id)
def test_signal_declares_what_it_reads_judges_and_says(signal: Signal) -> None:
    knowledge = load_knowledge()
    fields = set(StepPoint.model_fields) | RUN_FIELDS
    assert signal.reads, signal.id
    assert signal.reads | signal.optional <= fields
    profile_keys = set(knowledge.thresholds.profile().model_dump()) - {"name", "description"}
    assert set(signal.thresholds) <= profile_keys
    entry = knowledge.get(signal.id)
    assert set(getattr(entry, "thresholds", None) or []) <= set(signal.thresholds)
    assert signal.summary and signal.message
    assert signal.advice or signal.id == "healthy"
    assert signal.pathological, "every signal shows a series it reports"
    assert signal.healthy, "every signal shows a series it stays silent on"


def test_signals_run_after_the_signals_they_consult() -> None:
    rank = {s.id: s.rank for s in SIGNALS}
    for signal in SIGNALS:
        for consulted in signal.consults:
            assert consulted in rank, (signal.id, consulted)
            assert rank[consulted] < signal.rank, (signal.id, consulted)


@pytest.mark.parametrize(("signal", "example"), HEALTHY, ids=_id)
def test_healthy_example_is_silent(signal: Signal, example: Example) -> None:
    assert findings_of(signal, example.build(), example) == []


@pytest.mark.parametrize(("signal", "example"), PATHOLOGICAL, ids=_id)
def test_pathological_example_is_reported(signal: Signal, example: Example) -> None:
    found = findings_of(signal, example.build(), example)
    assert len(found) == 1, [f.id for f in run_signals(example.build(), profile_for(example))]
    finding = found[0]
    assert finding.severity == example.expect
    assert finding.origin == "runtime"
    assert finding.evidence["profile"] == profile_for(example).name
    for key, want in example.check.items():
        got = getattr(finding, key) if key in Finding.model_fields else finding.evidence[key]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-4), key
        else:
            assert got == want, key


@pytest.mark.parametrize(("signal", "example"), PATHOLOGICAL, ids=_id)
def test_pathological_example_needs_only_the_declared_fields(
    signal: Signal, example: Example
) -> None:
    stripped = only_declared(signal, example.build())
    found = findings_of(signal, stripped, example)
    assert [f.severity for f in found] == [example.expect]


@pytest.mark.parametrize("signal", SIGNALS, ids=_id)
def test_signal_is_skipped_without_its_fields(signal: Signal) -> None:
    """A log with the step numbers and nothing else: no signal runs, none fails."""
    bare = RunSeries(source="log", steps=[StepPoint(step=s) for s in (1, 5, 9, 40)])
    assert not signal.reads <= bare.available()
    assert run_signals(bare, load_knowledge().thresholds.profile()) == []


def test_a_log_with_loss_and_norm_only_gets_norm_verdicts() -> None:
    """Non-contiguous steps with a loss and a total norm: the norm signals judge them."""
    steps = [
        StepPoint(step=step, loss=2.0, grad_norm=2000.0 if step == 300 else 0.5)
        for step in range(0, 1000, 50)
    ]
    findings = run_signals(RunSeries(steps=steps), load_knowledge().thresholds.profile())
    ids = {f.id for f in findings}
    assert "exploding-gradients" in ids
    exploding = next(f for f in findings if f.id == "exploding-gradients")
    assert exploding.step == 300
    assert math.isclose(exploding.evidence["peak_norm"], 2000.0)


def test_each_optimizer_is_its_own_series() -> None:
    """A GAN: the generator's norms explode, the discriminator's do not; the finding says
    which optimizer, and the generator's rising loss is not called diverging."""
    steps = []
    for i in range(10):
        steps.append(StepPoint(step=2 * i + 1, optimizer=0, loss=0.7, grad_norm=0.5))
        steps.append(
            StepPoint(step=2 * i + 2, optimizer=1, loss=1.0 + i, grad_norm=2000.0 if i > 5 else 1.0)
        )
    run = RunSeries(steps=steps, optimizer_kinds=["Adam", "Adam"])
    findings = run_signals(run, load_knowledge().thresholds.profile())
    exploding = [f for f in findings if f.id == "exploding-gradients"]
    assert len(exploding) == 1
    assert exploding[0].evidence["optimizer"] == 1
    assert exploding[0].message.startswith("[optimizer 1 (Adam)]")
    assert "loss-diverging" not in {f.id for f in findings}


def test_causes_come_before_consequences_among_equals() -> None:
    """A diverging loss with exploding norms: both critical, the step size first."""
    losses = [4.2, 4.0, 3.9, 3.9, 5.0, 8.0, 12.0, 20.0, 30.0, 40.0, 45.0, 50.0]
    steps = [
        StepPoint(step=i + 1, loss=loss, grad_norm=1.0 if i < 4 else 5000.0, lr=0.5)
        for i, loss in enumerate(losses)
    ]
    findings = run_signals(RunSeries(steps=steps), load_knowledge().thresholds.profile())
    assert [f.id for f in findings][:2] == ["loss-diverging", "exploding-gradients"]
    assert findings[1].fix is not None and "step size first" in findings[1].fix.description
