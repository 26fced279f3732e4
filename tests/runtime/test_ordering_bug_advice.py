"""A blow-up caused by an ordering bug (clip after the step, undivided accumulation, ...) is
fixed by fixing the bug, not by lowering the learning rate: the step-size advice of
loss-diverging, exploding-gradients and update-param-ratio names the bug first when the same run
(or, in ``check``, the static analyser) found it, and stays as it was otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.knowledge.loader import load_thresholds
from gradient_doctor.probes.runtime.signals import RunSeries, run_signals
from gradient_doctor.probes.runtime.signals.base import (
    STEP_SIZE_FINDINGS,
    UPDATE_INFLATING,
    Example,
    ordering_bugs_first,
)
from gradient_doctor.probes.runtime.signals.loss_diverging import RISING

BUGGY = Path(__file__).resolve().parents[2] / "examples" / "buggy_train.py"
GOOD = ["zero-grad", "backward", "clip", "step"]
#: The clip at the top of the next iteration: after the step it was meant to limit.
LATE = ["clip", "zero-grad", "backward", "step"]
STEP_SIZE = (*STEP_SIZE_FINDINGS, "update-param-ratio")


def _blow_up(clip_late: bool) -> RunSeries:
    """A run whose loss climbs 4.2 → 15, whose norms reach 5000 and whose weights grow 30x."""
    steps = len(RISING)
    first = ["zero-grad", "backward", "step"] if clip_late else GOOD
    return Example(
        "blow-up",
        None,
        each={"lr": 0.1},
        series={
            "events": [first] + [LATE if clip_late else GOOD] * (steps - 1),
            "update_ratios": [{"fc1": 0.5, "fc2": 0.5}] * steps,
            "loss": RISING,
            "grad_norm": [1.0 + 500 * s for s in range(steps)],
            "param_norms": [[1.0 + 3 * s, 2.0 + 6 * s] for s in range(steps)],
        },
        run={"param_layers": ["fc1", "fc2"], "weight_layers": ["fc1", "fc2"]},
    ).build()


def _advice(findings: list[Finding]) -> dict[str, str]:
    return {f.id: f.fix.description for f in findings if f.id in STEP_SIZE and f.fix is not None}


def test_the_step_size_advice_names_a_clip_after_the_step_first() -> None:
    findings = run_signals(_blow_up(clip_late=True), load_thresholds().profile(None))
    ids = [f.id for f in findings]
    assert "clip-after-step" in ids
    advice = _advice(findings)
    assert set(advice) == set(STEP_SIZE), ids
    for text in advice.values():
        assert text.startswith("First fix the ordering bug reported with this (`clip-after-step`")
        assert "learning rate" in text  # the step size stays the second suspect


def test_without_an_ordering_bug_the_step_size_comes_first() -> None:
    findings = run_signals(_blow_up(clip_late=False), load_thresholds().profile(None))
    advice = _advice(findings)
    assert set(advice) == set(STEP_SIZE), [f.id for f in findings]
    assert advice["loss-diverging"].startswith("Reduce the step size first")
    assert not any("ordering bug" in text for text in advice.values())


@pytest.mark.parametrize("bug", sorted(UPDATE_INFLATING))
def test_every_update_inflating_bug_is_named_with_its_reason(bug: str) -> None:
    text = ordering_bugs_first("Reduce the step size first.", ["loss-diverging", bug])
    assert f"`{bug}`: {UPDATE_INFLATING[bug]}" in text
    assert text.endswith("reduce the step size first.")


def test_bugs_that_do_not_inflate_updates_leave_the_advice_alone() -> None:
    advice = "Reduce the step size first."
    assert ordering_bugs_first(advice, ["amp-double-unscale", "dead-neurons"]) == advice


@pytest.mark.slow
def test_check_points_the_blow_up_at_the_ordering_bugs_the_static_analyser_found() -> None:
    """``check`` on the example with undivided accumulation and a clip after the step: the
    static analyser finds both, the probed run diverges, and the step-size advice of the
    diverging loss sends the user to the two bugs first."""
    command = [sys.executable, "-m", "gradient_doctor.skill_server", "check", str(BUGGY)]
    done = subprocess.run(
        [*command, "--steps", "12", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    sources = {issue["id"]: issue["sources"] for issue in report["issues"]}
    assert "static" in sources["clip-after-step"] and "static" in sources["accum-unscaled-loss"]
    assert "loss-diverging" in sources, sources
    recommendation = next(r for r in report["recommendations"] if r.startswith("`loss-diverging`"))
    assert "First fix the ordering bugs reported with this (`accum-unscaled-loss`" in recommendation
    assert "`clip-after-step`" in recommendation
    assert recommendation.endswith("norm clipping as a guard against rare spikes.")


def test_both_step_size_signals_name_the_rate_seen_and_a_tenth_of_it() -> None:
    """loss-diverging and update-param-ratio tell the same story: the peak rate seen, whether a
    warmup was seen, and a concrete lower rate (a tenth of the peak)."""
    findings = run_signals(_blow_up(clip_late=False), load_thresholds().profile(None))
    by_id = {f.id: f for f in findings}
    assert {"loss-diverging", "update-param-ratio"} <= set(by_id)
    for entry_id in ("loss-diverging", "update-param-ratio"):
        finding = by_id[entry_id]
        assert finding.fix is not None
        assert "try 0.01, a tenth of 0.1" in finding.fix.description, entry_id
        assert "no warmup seen" in finding.message, entry_id
