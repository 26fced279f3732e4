"""A NaN loss caused by the learning rate is blamed on the step size, not on the loss
(``gradient-doctor probe`` through the real command line; slow: it runs the fixture)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

from .conftest import fixture

pytestmark = pytest.mark.slow


def _probe(*script_args: str) -> dict:
    done = run_cli(
        "probe", str(fixture("amp_lr_blowup")), "--steps", "12", "--format", "json",
        "--fail-on", "never", "--", *script_args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_nan_loss_after_an_oversized_update_heads_with_the_step_size() -> None:
    report = _probe()
    losses = [r["losses"][0] for r in report["records"]]
    first_bad = next(i for i, v in enumerate(losses) if v in ("NaN", "Infinity", "-Infinity"))
    assert first_bad > 0  # the shape: a finite loss, AdamW's update, then the overflow
    findings = report["findings"]
    headline = findings[0]
    assert headline["id"] == "loss-diverging" and headline["severity"] == "critical"
    assert headline["step"] == first_bad + 1
    assert headline["fix"]["description"].startswith("Reduce the step size first")
    assert "learning rate (try 0.3, a tenth of 3)" in headline["fix"]["description"]
    assert "the loss computation is not the cause" in headline["message"]
    assert "Learning rate 3 from the first measured step on" in headline["message"]
    ids = [f["id"] for f in findings]
    assert "nan-loss-before-backward" not in ids
    # The GradScaler's skips follow from the NaN loss: its advice does not send the user
    # looking for an operation whose backward overflows.
    skips = next(f for f in findings if f["id"] == "amp-overflow-skips")
    assert "already non-finite" in skips["message"]
    assert "backward gives Inf/NaN" not in skips["fix"]["description"]


def test_the_same_model_at_a_sane_learning_rate_is_healthy() -> None:
    report = _probe("healthy")
    assert [f["id"] for f in report["findings"]] == ["healthy"]
