"""The parent-side diagnosis on synthetic step records (no torch, no subprocess)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.diagnose import diagnose
from gradient_doctor.probes.runtime.result import ChildSummary, NanOrigin, StepRecord, TensorDetail

PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
LAYERS = ["fc1", "fc1", "fc2", "fc2"]
SHAPES = [[8, 4], [8], [1, 8], [1]]


@pytest.fixture(scope="module")
def profile() -> ThresholdProfile:
    return load_knowledge().thresholds.profile()


def summary(**extra: Any) -> ChildSummary:
    base: dict[str, Any] = {
        "status": "stopped",
        "parameters": PARAMS,
        "shapes": SHAPES,
        "layers": LAYERS,
        "layer_types": {"fc1": "Linear", "fc2": "Linear"},
    }
    base.update(extra)
    return ChildSummary.model_validate(base)


def record(
    step: int, norms: list[float | None], loss: float | None = 1.0, **extra: Any
) -> StepRecord:
    finite = [n for n in norms if n is not None]
    total = math.sqrt(sum(n * n for n in finite)) if all(map(math.isfinite, finite)) else math.nan
    if any(math.isinf(n) for n in finite) and not any(math.isnan(n) for n in finite):
        total = math.inf
    data: dict[str, Any] = {
        "step": step,
        "grad_norms": norms,
        "total_norm": total,
        "losses": [loss],
        "loss_ops": ["MseLossBackward0"],
        "events": ["zero-grad", "backward", "step"],
        "grad_reused": False,
    }
    data.update(extra)
    return StepRecord.model_validate(data)


def ids(findings: list[Any]) -> list[str]:
    return [f.id for f in findings]


def test_healthy_run_reports_only_healthy(profile: ThresholdProfile) -> None:
    records = [record(s, [0.5, 0.1, 0.4, 0.1], loss=2.0 - 0.05 * s) for s in range(1, 13)]
    findings = diagnose(records, summary(), profile)
    assert ids(findings) == ["healthy"]
    assert findings[0].severity == "info"
    assert findings[0].evidence["profile"] == profile.name


def test_exploding_severity_follows_profile(profile: ThresholdProfile) -> None:
    warn = profile.exploding_warning.value
    crit = profile.exploding_critical.value
    mid = [record(s, [warn * 1.5, 0.1, 1.0, 0.1]) for s in range(1, 6)]
    (finding,) = [f for f in diagnose(mid, summary(), profile) if f.id == "exploding-gradients"]
    assert finding.severity == "warning"
    high = [record(s, [crit * 2, 0.1, 1.0, 0.1]) for s in range(1, 6)]
    (finding,) = [f for f in diagnose(high, summary(), profile) if f.id == "exploding-gradients"]
    assert finding.severity == "critical"
    assert finding.evidence["peak_norm"] == pytest.approx(crit * 2, rel=1e-3)


def test_nan_order_loss_before_gradients(profile: ThresholdProfile) -> None:
    records = [
        record(1, [0.5, 0.1, 0.4, 0.1]),
        record(2, [math.nan, math.nan, math.nan, math.nan], loss=math.nan),
    ]
    findings = diagnose(records, summary(), profile)
    assert ids(findings)[0] == "nan-loss-before-backward"
    assert "nan-gradients" not in ids(findings)


def test_nan_gradients_with_finite_loss_name_the_parameter(profile: ThresholdProfile) -> None:
    origin = NanOrigin(step=2, phase="backward", module="fc2", detail="born in fc2's backward")
    records = [record(1, [0.5, 0.1, 0.4, 0.1]), record(2, [0.5, 0.1, math.nan, 0.1])]
    findings = diagnose(records, summary(nan_origin=origin), profile)
    first = findings[0]
    assert first.id == "nan-gradients"
    assert first.parameter == "fc2.weight"
    assert first.step == 2
    assert first.module == "fc2"
    assert "born in fc2's backward" in first.message


def test_inf_gradients(profile: ThresholdProfile) -> None:
    records = [record(1, [0.5, 0.1, math.inf, 0.1])]
    assert ids(diagnose(records, summary(), profile))[0] == "inf-gradients"


def test_non_finite_parameters_come_first(profile: ThresholdProfile) -> None:
    records = [
        record(1, [0.5, 0.1, 0.4, 0.1]),
        record(2, [math.nan] * 4, loss=math.nan, nonfinite_params=["fc1.weight"]),
    ]
    findings = diagnose(records, summary(), profile)
    assert ids(findings)[0] == "nan-parameters"
    assert findings[0].parameter == "fc1.weight"
    assert "nan-loss-before-backward" not in ids(findings)


def test_vanishing_only_when_loss_is_not_improving(profile: ThresholdProfile) -> None:
    tiny = profile.vanishing_warning.value / 100
    falling = [record(s, [tiny, tiny, tiny, tiny], loss=3.0 - 0.2 * s) for s in range(1, 13)]
    assert "vanishing-gradients" not in ids(diagnose(falling, summary(), profile))
    flat = [record(s, [tiny, tiny, tiny, tiny], loss=1.0) for s in range(1, 13)]
    assert "vanishing-gradients" in ids(diagnose(flat, summary(), profile))


def test_layer_spread_and_zero_gradients(profile: ThresholdProfile) -> None:
    spread = profile.layer_spread_critical.value * 10
    records = [record(s, [1.0, 0.0, 1.0 / spread, None]) for s in range(1, 6)]
    findings = {f.id: f for f in diagnose(records, summary(), profile)}
    assert findings["layer-norm-spread"].severity == "critical"
    assert findings["layer-norm-spread"].module == "fc2"
    assert findings["zero-gradients"].parameter == "fc1.bias"


def test_order_of_calls(profile: ThresholdProfile) -> None:
    after = [
        record(1, [0.5, 0.1, 0.4, 0.1], events=["zero-grad", "backward", "step"]),
        record(2, [0.5, 0.1, 0.4, 0.1], events=["clip", "zero-grad", "backward", "step"]),
    ]
    assert "clip-after-step" in ids(diagnose(after, summary(), profile))
    before = [
        record(s, [0.5, 0.1, 0.4, 0.1], events=["zero-grad", "clip", "backward", "step"])
        for s in (1, 2)
    ]
    found = ids(diagnose(before, summary(), profile))
    assert "clip-before-backward" in found and "clip-after-step" not in found


def test_accumulation_checks(profile: ThresholdProfile) -> None:
    micro = ["backward"] * 4
    unscaled = [
        record(
            s,
            [0.5, 0.1, 0.4, 0.1],
            events=["zero-grad", *micro, "step"],
            losses=[1.0] * 4,
            loss_ops=["MseLossBackward0"] * 4,
        )
        for s in range(1, 5)
    ]
    assert "accum-unscaled-loss" in ids(diagnose(unscaled, summary(), profile))
    scaled = [r.model_copy(update={"loss_ops": ["DivBackward0"] * 4}) for r in unscaled]
    assert "accum-unscaled-loss" not in ids(diagnose(scaled, summary(), profile))
    zeroing = [
        record(
            s,
            [0.5, 0.1, 0.4, 0.1],
            events=["zero-grad", "backward", "zero-grad", "backward", "step"],
            losses=[1.0, 1.0],
            loss_ops=["DivBackward0"] * 2,
        )
        for s in range(1, 5)
    ]
    assert "accum-zero-grad-every-microstep" in ids(diagnose(zeroing, summary(), profile))
    missing = [
        record(s, [0.5 * s, 0.1, 0.4, 0.1], events=["backward", "step"], grad_reused=s > 1)
        for s in range(1, 6)
    ]
    assert "accum-missing-zero-grad" in ids(diagnose(missing, summary(), profile))


def test_amp_checks(profile: ThresholdProfile) -> None:
    no_unscale = [
        record(
            s,
            [0.5, 0.1, 0.4, 0.1],
            events=["zero-grad", "scale", "backward", "clip", "scaler-step", "step"],
            # The clip saw 3e4 at scale 65536; the child records every norm unscaled.
            total_norm_before_clip=3e4 / 65536.0,
            clip_max_norm=1.0,
            clipped=True,
            scale=65536.0,
        )
        for s in range(1, 4)
    ]
    found = ids(diagnose(no_unscale, summary(), profile))
    assert "amp-clip-without-unscale" in found
    assert "amp-step-bypasses-scaler" not in found
    assert "exploding-gradients" not in found  # the scaled norm is not an explosion
    findings = diagnose(no_unscale, summary(), profile)
    clip = next(f for f in findings if f.id == "amp-clip-without-unscale")
    assert clip.evidence["clip_saw_norm"] == pytest.approx(3e4)
    bypass = [
        record(s, [0.5, 0.1, 0.4, 0.1], events=["zero-grad", "scale", "backward", "step"])
        for s in range(1, 4)
    ]
    assert "amp-step-bypasses-scaler" in ids(diagnose(bypass, summary(), profile))
    assert "amp-double-unscale" in ids(
        diagnose([], summary(status="script-error", double_unscale=1), profile)
    )


def test_amp_overflow_skips_ignore_initial_calibration(profile: ThresholdProfile) -> None:
    def amp(step: int, skipped: bool) -> StepRecord:
        return record(
            step,
            [0.5, 0.1, 0.4, 0.1],
            skipped=skipped,
            scale=2.0 ** (16 - step),
            events=["scale", "backward", "scaler-step", "scaler-update"],
        )

    calibrating = [amp(s, s <= 3) for s in range(1, 12)]
    assert "amp-overflow-skips" not in ids(diagnose(calibrating, summary(), profile))
    overflowing = [amp(s, s % 2 == 0) for s in range(1, 12)]
    assert "amp-overflow-skips" in ids(diagnose(overflowing, summary(), profile))


def test_clip_activity(profile: ThresholdProfile) -> None:
    always = [
        record(
            s,
            [0.01, 0.001, 0.01, 0.001],
            events=["backward", "clip", "step"],
            total_norm_before_clip=5.0,
            clip_max_norm=0.01,
            clipped=True,
        )
        for s in range(1, 8)
    ]
    assert "clip-too-aggressive" in ids(diagnose(always, summary(), profile))


def test_dead_neurons_and_ratio_from_sampled_steps(profile: ThresholdProfile) -> None:
    detail = TensorDetail(
        max_abs=1, mean=0, std=1, zeros=0, nans=0, infs=0, numel=32, param_norm=1e-3, ratio=500
    )
    records = [
        record(
            s,
            [0.5, 0.1, 0.4, 0.1],
            sampled=True,
            dead_units={"relu": [60, 64]},
            detail=[detail, detail, detail, detail],
        )
        for s in (1, 10)
    ]
    found = {f.id: f for f in diagnose(records, summary(), profile)}
    assert found["dead-neurons"].severity == "critical"
    assert found["dead-neurons"].evidence["dead_units"] == 60
    assert found["grad-param-ratio"].severity == "warning"


def test_trends(profile: ThresholdProfile) -> None:
    rising = [record(s, [0.1 * 1.5**s, 0.0, 0.1 * 1.5**s, 0.0]) for s in range(1, 17)]
    assert "grad-norm-rising" in ids(diagnose(rising, summary(), profile))
    spikes = [record(s, [100.0 if s == 9 else 0.5, 0.1, 0.4, 0.1]) for s in range(1, 17)]
    assert "grad-norm-spikes" in ids(diagnose(spikes, summary(), profile))
    decaying = [record(s, [0.5 * 0.5**s, 0.0, 0.5 * 0.5**s, 0.0], loss=1.0) for s in range(1, 17)]
    assert "grad-norm-decaying" in ids(diagnose(decaying, summary(), profile))


def test_saturating_deep_net(profile: ThresholdProfile) -> None:
    records = [record(s, [0.5, 0.1, 0.4, 0.1]) for s in range(1, 4)]
    assert "saturating-deep-net" in ids(diagnose(records, summary(saturating_modules=30), profile))


def test_other_profiles_change_verdicts() -> None:
    thresholds = load_knowledge().thresholds
    gs = thresholds.profile("gs")
    default = thresholds.profile()
    records = [record(s, [30.0, 0.1, 1.0, 0.1]) for s in range(1, 6)]
    assert "exploding-gradients" in ids(diagnose(records, summary(), gs))
    assert "exploding-gradients" not in ids(diagnose(records, summary(), default))


def test_clip_never_active_while_unstable(profile: ThresholdProfile) -> None:
    records = [
        record(
            s,
            [0.5, 0.1, 0.4, 0.1],
            loss=1.0 + 0.5 * s,
            events=["backward", "clip", "step"],
            total_norm_before_clip=0.66,
            clip_max_norm=100.0,
            clipped=False,
        )
        for s in range(1, 10)
    ]
    found = {f.id: f for f in diagnose(records, summary(), profile)}
    assert found["clip-never-active"].severity == "info"
    calm = [r.model_copy(update={"losses": [1.0]}) for r in records]
    assert "clip-never-active" not in ids(diagnose(calm, summary(), profile))


def test_spikes_capped_by_a_well_placed_clip_are_info(profile: ThresholdProfile) -> None:
    def clipped_run(events: list[str]) -> list[StepRecord]:
        runs = []
        for s in range(1, 17):
            raw = 100.0 if s == 9 else 0.5
            runs.append(
                record(
                    s,
                    [min(raw, 1.0), 0.1, 0.4, 0.1],
                    events=events,
                    total_norm_before_clip=raw,
                    clip_max_norm=1.0,
                    clipped=raw > 1.0,
                )
            )
        return runs

    found = {
        f.id: f for f in diagnose(clipped_run(["backward", "clip", "step"]), summary(), profile)
    }
    assert found["grad-norm-spikes"].severity == "info"
    assert found["grad-norm-spikes"].evidence["contained_by_clipping"] is True
    unclipped = [record(s, [100.0 if s == 9 else 0.5, 0.1, 0.4, 0.1]) for s in range(1, 17)]
    found = {f.id: f for f in diagnose(unclipped, summary(), profile)}
    assert found["grad-norm-spikes"].severity == "warning"
    # A clip after the step caps nothing the optimizer used: still a warning.
    late = clipped_run(["clip", "zero-grad", "backward", "step"])
    found = {f.id: f for f in diagnose(late, summary(), profile)}
    assert "clip-after-step" in found
    assert found["grad-norm-spikes"].severity == "warning"
