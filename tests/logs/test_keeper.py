"""The bounded series: memory stays bounded, and first-NaN and spike verdicts stay exact."""

from __future__ import annotations

import math
import random
from pathlib import Path

from gradient_doctor.probes.logs import diagnose_log
from gradient_doctor.probes.logs.keeper import Keeper
from gradient_doctor.probes.runtime.diagnose import resolve_profile
from gradient_doctor.probes.runtime.signals import RunSeries, StepPoint, run_signals

STEPS = 30_000
SPIKES = (7_001, 13_456, 21_999)
NAN_AT = 27_777


def _norm(step: int, rng: random.Random) -> float:
    if step in SPIKES:
        return 50.0
    if step >= NAN_AT:
        return math.nan
    return 0.5 + 0.1 * rng.random()


def _write_log(path: Path) -> list[dict[str, float]]:
    rng = random.Random(0)
    rows = []
    with path.open("w") as handle:
        for step in range(1, STEPS + 1):
            norm = _norm(step, rng)
            loss = 2.0 / math.sqrt(step) if step < NAN_AT else math.nan
            rows.append({"step": step, "loss": loss, "grad_norm": norm})
            handle.write(f"step {step} | loss {loss:.6f} | grad_norm {norm:.6f} | lr 1e-3\n")
    return rows


def test_a_long_log_keeps_a_bounded_series_with_exact_anomalies(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    rows = _write_log(log)
    report = diagnose_log(str(log))
    assert report.steps_read == STEPS
    assert report.kept_steps < 6_000
    assert report.sample_stride > 1
    assert report.counts.first_nonfinite_step == NAN_AT
    assert report.counts.norm_spikes == len(SPIKES)
    assert report.counts.first_norm_spike_step == SPIKES[0]
    kept = report.series
    assert kept is not None
    for spike in SPIKES:  # the spike and its neighbourhood are there step by step
        assert all(s in kept["step"] for s in range(spike - 10, spike + 2))
    # the same verdicts as the signals give on every step
    full = RunSeries(source="log", steps=[StepPoint(**row) for row in rows])  # type: ignore[arg-type]
    expected = {f.id: f for f in run_signals(full, resolve_profile(None))}
    found = {f.id: f for f in report.findings}
    assert (
        found["grad-norm-spikes"].evidence["spikes"]
        == expected["grad-norm-spikes"].evidence["spikes"]
    )
    assert found["grad-norm-spikes"].step == expected["grad-norm-spikes"].step == SPIKES[0]
    assert found["nan-loss-before-backward"].step == NAN_AT


def test_the_keeper_never_holds_more_than_its_budget() -> None:
    keeper = Keeper(spike_factor=10.0, head=100, tail=100, middle=500, max_anomalies=20)
    rng = random.Random(1)
    for step in range(1, 200_001):
        norm = 100.0 if rng.random() < 0.001 else 1.0  # ~200 spikes, more than max_anomalies
        keeper.add({"step": step, "grad_norm": norm})
        held = len(keeper._head) + len(keeper._recent) + len(keeper._middle)
        assert held <= 100 + 100 + 501 + 20
    kept = keeper.finish()
    assert len(kept) <= 100 + 100 + 501 + 20 * (10 + 1 + 3)
    assert keeper.stats.anomalies_dropped > 0
    assert keeper.stats.norm_spikes > 150  # counted exactly, kept or not
    assert [p["step"] for p in kept] == sorted(p["step"] for p in kept)
