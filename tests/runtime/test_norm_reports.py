"""The reports' total gradient norm is the raw norm (before the script's clipping), with what
the clip did, and the probe's markdown, the diagnosis' summary row and the JSON agree."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gradient_doctor.probes.runtime.norms import norm_summary
from gradient_doctor.probes.runtime.result import StepRecord
from tests.conftest import run_cli

from .conftest import fixture


def _row(markdown: str, metric: str) -> str:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {metric} |"))
    return line.split("|")[2].strip()


@pytest.mark.slow
def test_probe_reports_the_norm_before_clipping_and_how_much_the_clip_cut(
    tmp_path: Path,
) -> None:
    # clip_too_aggressive clips at max_norm=0.001 every step: the applied norm is 0.001
    # while the gradients' own norm is about 0.42.
    script = str(fixture("clip_too_aggressive"))
    done = run_cli(
        "probe", script, "--steps", "6", "--format", "json", "--fail-on", "never",
        "--plots", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    raw = statistics.median(data["total_norm_before_clip"])
    applied = statistics.median(data["total_norm"])
    assert raw > 100 * applied  # the shape this test is about
    assert (tmp_path / "total-norm.png").is_file()

    markdown = run_cli("probe", script, "--steps", "6", "--fail-on", "never").stdout
    row = _row(markdown, "Total gradient norm")
    assert row.startswith(f"median {raw:.3g}, max ")
    assert "before clipping (6 steps)" in row
    assert "the clip (max_norm 0.001) cut 6 of 6 steps" in row
    assert f"by {raw / applied:.3g}× median" in row
    assert f"median {applied:.3g}" not in row


@pytest.mark.slow
def test_check_summary_row_shows_the_raw_norm() -> None:
    script = str(fixture("clip_too_aggressive"))
    done = run_cli("check", script, "--steps", "6", "--format", "json", "--fail-on", "critical")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    row = next(r for r in report["summary"] if r["metric"] == "Total grad norm")
    assert "before clipping (6 steps)" in row["value"]
    assert "cut 6 of 6 steps" in row["value"]
    assert row["value"].startswith("median 0.42")


def _record(step: int, events: list[str], applied: float, before: float) -> StepRecord:
    return StepRecord(
        step=step,
        grad_norms=[],
        total_norm=applied,
        total_norm_before_clip=before,
        clip_max_norm=1.0,
        clipped=before > 1.0,
        events=events,  # type: ignore[arg-type]
    )


def test_clip_after_the_step_reports_the_applied_norm_and_no_cut() -> None:
    # The clip ran after step(): the update used the unclipped gradients (norm 5), and the
    # clip's own reading belongs to gradients already applied.
    late = [_record(s, ["backward", "step", "clip"], 5.0, 5.0) for s in range(1, 5)]
    summary = norm_summary(late)
    assert (summary.median, summary.before_clip, summary.cut_steps) == (5.0, False, 0)
    assert "ran after the step" in summary.text()
    # The same numbers with the clip in place: the update was cut 5×.
    shaped = [_record(s, ["backward", "clip", "step"], 1.0, 5.0) for s in range(1, 5)]
    text = norm_summary(shaped).text()
    assert text == (
        "median 5, max 5 before clipping (4 steps); the clip (max_norm 1) cut 4 of 4 steps, "
        "by 5× median (5× max)"
    )


@pytest.mark.slow
def test_two_optimizers_get_their_own_norms_and_losses_in_the_report() -> None:
    markdown = run_cli(
        "probe", str(fixture("gan_two_optimizers")), "--steps", "10", "--fail-on", "never"
    ).stdout
    optimizers = _row(markdown, "Optimizers")
    assert optimizers.count("total ‖g‖ median") == 2 and "(5 steps)" in optimizers
    loss = _row(markdown, "Loss")  # one trend per optimizer, not D's first and G's last
    assert loss.startswith("`optD` (Adam): ") and "; `optG` (Adam): " in loss
    assert "total gradient norm per optimizer `optD` (Adam) " in markdown


@pytest.mark.slow
def test_a_nan_read_from_the_data_mid_forward_is_not_called_finite_inputs() -> None:
    done = run_cli(
        "probe", str(fixture("nan_in_sequence")), "--steps", "4", "--format", "json",
        "--fail-on", "never",
    )  # fmt: skip
    origin = json.loads(done.stdout)["nan_origin"]
    assert origin["module"] == "cell"
    assert "from finite inputs" not in origin["detail"]
    assert "first non-finite output" in origin["detail"]
