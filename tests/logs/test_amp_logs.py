"""GradScaler behaviour read from logs that have no probe events: only a scale column, maybe a
norm. Overflowed steps the scaler skipped are not gradients the run applied."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradient_doctor.probes.logs import diagnose_log

SERIOUS = ("warning", "critical")


def _write(tmp_path: Path, rows: list[dict[str, float]], name: str = "metrics.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _healthy_with_overflows(overflow_steps: set[int], norm: float) -> list[dict[str, float]]:
    """A run of 120 steps whose scaler overflows (norm Inf/NaN, scale halved) on a few steps."""
    rows, scale = [], 2.0**16
    for step in range(1, 121):
        skipped = step in overflow_steps
        rows.append(
            {
                "step": step,
                "loss": 2.0 * math.exp(-step / 60),
                "grad_norm": norm if skipped else 0.8 + 0.1 * math.sin(step),
                "lr": 1e-3,
                "loss_scale": scale,
            }
        )
        if skipped:
            scale /= 2
        elif step % 50 == 0:
            scale *= 2  # growth_interval reached
    return rows


@pytest.mark.parametrize("overflow", [float("inf"), float("nan")])
def test_occasional_overflows_are_neither_exploding_nor_spikes_nor_nan(
    tmp_path: Path, overflow: float
) -> None:
    rows = _healthy_with_overflows({1, 2, 3, 40, 77, 101}, overflow)
    report = diagnose_log(_write(tmp_path, rows))
    assert report.counts.skipped_steps == 6
    assert report.counts.first_nonfinite_step is None
    serious = {f.id for f in report.findings if f.severity in SERIOUS}
    assert serious == set(), [f.message for f in report.findings]


def test_a_scale_that_keeps_collapsing_without_norms_is_flagged(tmp_path: Path) -> None:
    # Only loss and scale are logged: the scale halves at every logged step.
    rows = [{"step": step, "loss": 1.5, "loss_scale": 2.0 ** (16 - step)} for step in range(1, 81)]
    report = diagnose_log(_write(tmp_path, rows))
    finding = next(f for f in report.findings if f.id == "amp-overflow-skips")
    assert finding.severity == "warning"
    assert finding.evidence["scale_collapsed"] is True
    assert "calibration" not in finding.message


def test_calibration_skips_at_the_start_stay_silent(tmp_path: Path) -> None:
    rows = _healthy_with_overflows({1, 2, 3}, float("inf"))
    report = diagnose_log(_write(tmp_path, rows, "table.jsonl"))
    assert "amp-overflow-skips" not in {f.id for f in report.findings}
