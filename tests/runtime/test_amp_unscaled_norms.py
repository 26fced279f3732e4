"""Under a GradScaler every norm the probe reports is unscaled, and a clip is blamed for the
scaled gradients only when it really saw them (``gradient-doctor probe`` through the real
command line on ``amp_scaler_shapes.py``; slow: each test runs the fixture)."""

from __future__ import annotations

import json
import math
from functools import cache

import pytest

from tests.conftest import run_cli

from .conftest import fixture

pytestmark = pytest.mark.slow

#: The GradScaler's initial scale: a norm read on scaled gradients is this much too large.
SCALE = 65536.0


@cache
def _probe(variant: str) -> dict:
    done = run_cli(
        "probe", str(fixture("amp_scaler_shapes")), "--steps", "20", "--format", "json",
        "--fail-on", "never", "--", variant,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _finite(values: list) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


def _assert_unscaled(report: dict) -> None:
    """The series, the per-step records, the layer norms: gradient-sized, not scale× that."""
    records = report["records"]
    assert records and all(r["scale"] == SCALE for r in records[:3])
    norms = _finite(report["total_norm"])
    assert norms and max(norms) < 100, norms
    before = _finite(report["total_norm_before_clip"] or [])
    assert all(v < 100 for v in before), before
    layer = [v for row in report["layer_norms"] for v in _finite(row["norms"])]
    assert layer and max(layer) < 100
    for record in records:
        assert all(v < 100 for v in _finite(record["grad_norms"]))


def test_a_fused_optimizer_without_unscale_reads_unscaled_norms_and_is_healthy() -> None:
    # A fused AdamW gets the scale from scaler.step() and divides inside its kernel: the
    # gradients still carry 65536 when the step starts (nanoGPT, float16, grad_clip 0).
    report = _probe("healthy")
    assert _ids(report) == ["healthy"]
    _assert_unscaled(report)
    assert not any(r["skipped"] for r in report["records"])


def test_a_learning_rate_blow_up_under_a_fused_scaler_heads_with_the_step_size() -> None:
    report = _probe("lr-blowup")
    ids = _ids(report)
    assert ids[0] in ("loss-diverging", "update-param-ratio"), ids
    assert {"loss-diverging", "update-param-ratio"} <= set(ids)
    # No scaled norm to call exploding, and the fused step's overflow is a skip, not Inf
    # gradients the optimizer applied.
    assert "exploding-gradients" not in ids and "inf-gradients" not in ids
    _assert_unscaled(report)
    records = report["records"]
    overflowed = [r["step"] for r in records if r["total_norm"] in ("Infinity", "NaN")]
    assert overflowed and all(records[s - 1]["skipped"] for s in overflowed)
    # The GradScaler halved its scale after each of those skips.
    after = records[overflowed[-1]]
    assert after["scale"] < SCALE


@pytest.mark.parametrize("variant", ["clip-after-step", "clip-after-step-fused"])
def test_a_clip_after_scaler_step_is_clip_after_step_alone(variant: str) -> None:
    # scaler.step() unscaled the gradients (or the fused kernel wrote them back unscaled):
    # the late clip saw real norms, not scaled ones.
    report = _probe(variant)
    ids = _ids(report)
    assert ids[0] == "clip-after-step"
    assert "amp-clip-without-unscale" not in ids and "exploding-gradients" not in ids
    _assert_unscaled(report)


def test_a_clip_on_scaled_gradients_is_reported_with_what_it_saw() -> None:
    report = _probe("no-unscale")
    finding = next(f for f in report["findings"] if f["id"] == "amp-clip-without-unscale")
    assert finding["severity"] == "critical" and finding["step"] == 1
    first = report["records"][0]
    # Recorded unscaled; the clip itself compared scale× that with max_norm 1 and cut.
    assert 0.1 < first["total_norm_before_clip"] < 100 and first["clipped"] is True
    seen = first["total_norm_before_clip"] * SCALE
    assert finding["evidence"]["clip_saw_norm"] == pytest.approx(seen, rel=1e-3)
    assert "at scale 65536" in finding["message"]
    assert "exploding-gradients" not in _ids(report)
