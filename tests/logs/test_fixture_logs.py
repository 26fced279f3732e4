"""Every format on logs written by real trainings (tests/fixtures/logs/make_logs.py).

Scenarios: healthy, diverging (learning rate far too high), nan (a corrupt batch at step 120),
rising (a warmup past the stable edge: the norm grows for dozens of steps, then NaN) and amp (a
GradScaler whose scale collapses because every step's gradients overflow). Each log is
diagnosed through the public API; the CLI and MCP tests run a few of them end to end.
"""

from __future__ import annotations

import pytest
from logs_paths import FIXTURES

from gradient_doctor.probes.logs import LogReport, diagnose_log
from gradient_doctor.probes.runtime.signals import signal_ids

OWN_LOOP = {  # file pattern, format id, series every scenario has
    "nanogpt_{}.log": ("nanogpt", {"loss"}),
    "accelerate_{}.log": ("console", {"loss", "grad_norm", "lr"}),
    "metrics_{}.jsonl": ("jsonl", {"loss", "grad_norm", "lr"}),
    "table_{}.csv": ("csv", {"loss", "grad_norm", "lr"}),
    "tb_{}": ("tensorboard", {"loss", "grad_norm", "lr"}),
    "monitor_{}.jsonl": ("gradient-monitor", {"grad_norm", "lr", "layer_grad_norms"}),
}
LIBRARIES = {
    "hf_{}.log": ("hf-trainer", {"loss", "grad_norm", "lr"}),
    "hf_{}_trainer_state.json": ("hf-trainer-state", {"loss", "grad_norm", "lr"}),
    "hf_tb_{}": ("tensorboard", {"loss", "grad_norm", "lr"}),
    "lightning_{}_metrics.csv": ("csv", {"loss", "grad_norm", "lr", "layer_grad_norms"}),
}
CASES = [
    (pattern, scenario)
    for pattern in OWN_LOOP
    for scenario in ("healthy", "diverging", "nan", "rising", "amp")
] + [
    (pattern, scenario)
    for pattern in LIBRARIES
    for scenario in ("healthy", "diverging", "nan", "rising")
    if (FIXTURES / pattern.format(scenario)).exists()
]
SERIOUS = ("warning", "critical")


def _report(pattern: str, scenario: str) -> LogReport:
    if "tb_" in pattern:
        pytest.importorskip("tensorboard", reason="the optional tensorboard reader is absent")
    return diagnose_log(str(FIXTURES / pattern.format(scenario)))


def _ids(report: LogReport, *severities: str) -> set[str]:
    return {f.id for f in report.findings if f.severity in (severities or SERIOUS)}


@pytest.mark.parametrize(("pattern", "scenario"), CASES, ids=[p.format(s) for p, s in CASES])
def test_format_and_series_are_found(pattern: str, scenario: str) -> None:
    report = _report(pattern, scenario)
    fmt, series = {**OWN_LOOP, **LIBRARIES}[pattern]
    assert report.format == fmt
    assert report.steps_read >= 80
    if scenario == "amp" and "grad_norm" in series:
        # every step overflowed and was skipped: its norm is not a gradient the run applied
        series = series - {"grad_norm", "layer_grad_norms"}
    assert series <= set(report.series_found)


@pytest.mark.parametrize("pattern", [*OWN_LOOP, *LIBRARIES])
def test_healthy_runs_get_no_warning(pattern: str) -> None:
    report = _report(pattern, "healthy")
    assert not _ids(report), report.findings
    assert report.counts.first_nonfinite_step is None
    if "grad_norm" in report.series_found:
        assert _ids(report, "info") == {"healthy"}


@pytest.mark.parametrize("pattern", [*OWN_LOOP, *LIBRARIES])
def test_nan_runs_name_the_first_non_finite_step(pattern: str) -> None:
    report = _report(pattern, "nan")
    first = report.counts.first_nonfinite_step
    assert first is not None
    if pattern in OWN_LOOP:  # sequential batches: the corrupt one is step 120
        assert first == 120
    if pattern.startswith("lightning"):  # Lightning counts steps from 0
        assert first == 119
    critical = {f.id: f for f in report.findings if f.severity == "critical"}
    nan_ids = {"nan-loss-before-backward", "nan-gradients"}
    assert nan_ids & set(critical), report.findings
    assert next(critical[i] for i in nan_ids if i in critical).step == first


@pytest.mark.parametrize("pattern", [*OWN_LOOP, *LIBRARIES])
def test_diverging_runs_are_flagged(pattern: str) -> None:
    if not (FIXTURES / pattern.format("diverging")).exists():
        pytest.skip("no diverging run for this library")
    report = _report(pattern, "diverging")
    summary = report.summary
    assert summary.loss_last is not None and summary.loss_first is not None
    if "loss-diverging" in signal_ids():
        assert "loss-diverging" in _ids(report)
    if "grad_norm" in report.series_found:
        assert {"exploding-gradients", "grad-norm-rising"} & _ids(report)
    else:  # a loss-only log: the loss spikes are counted exactly
        assert summary.loss_last > 100 * summary.loss_first
        assert report.counts.loss_spikes > 0


@pytest.mark.parametrize("pattern", [p for p in [*OWN_LOOP, *LIBRARIES] if "hf" not in p])
def test_rising_norms_are_caught_before_the_nan(pattern: str) -> None:
    report = _report(pattern, "rising")
    first = report.counts.first_nonfinite_step
    assert first is not None
    if "grad_norm" in report.series_found:
        exploding = next(f for f in report.findings if f.id == "exploding-gradients")
        assert exploding.severity == "critical" and exploding.step < first  # type: ignore[operator]
        assert report.summary.lr_last > report.summary.lr_first  # type: ignore[operator]


@pytest.mark.parametrize("pattern", [p for p in OWN_LOOP if p != "nanogpt_{}.log"])
def test_amp_scale_collapse_is_read_as_skipped_steps_not_nan_gradients(pattern: str) -> None:
    report = _report(pattern, "amp")
    assert report.counts.skipped_steps == report.steps_read == 160
    assert report.counts.scale_drops >= 150
    assert report.summary.scale_last is not None and report.summary.scale_last < 1e-30
    assert report.counts.first_nonfinite_step is None
    assert not {"nan-gradients", "exploding-gradients", "grad-norm-spikes"} & _ids(report)
    # Every step skipped and a scale far below 1 is a collapse, not calibration.
    skips = next(f for f in report.findings if f.id == "amp-overflow-skips")
    assert skips.evidence["every_step_skipped"] is True
    assert skips.evidence["scale_collapsed"] is True
    assert "skipped every step (160 of 160)" in skips.message
    assert "calibration" not in skips.message
    assert skips.fix is not None and "cannot fix" in skips.fix.description
