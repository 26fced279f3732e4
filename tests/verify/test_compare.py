"""The verification status words, as ``probes.verify.compare`` defines them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gradient_doctor.probes.runtime.result import ProbeResult, SeedCall, SeedingInfo, StepRecord
from gradient_doctor.probes.verify.compare import compare, run_side
from gradient_doctor.probes.verify.model import FoundId, RunSide

PATCH = "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n"
START = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def side(
    found: dict[str, tuple[str, str]],
    status: str = "stopped",
    *,
    start: list[float] | None = START,
    message: str | None = None,
    **extra: Any,
) -> RunSide:
    """A run with ``{id: (severity, "static"|"runtime"|"both")}`` found."""
    sources = {"static": ["static"], "runtime": ["runtime"], "both": ["static", "runtime"]}
    return RunSide(
        status=status,
        steps=10 if status in ("ok", "stopped") else 0,
        steps_requested=10,
        message=message,
        findings=[
            FoundId(id=i, severity=sev, sources=sources[where])  # type: ignore[arg-type]
            for i, (sev, where) in found.items()
        ],
        seeding=SeedingInfo(seed=0, seeded=["random", "torch"], start_fingerprint=start),
        **extra,
    )


BUG = {"clip-after-step": ("critical", "both"), "no-grad-monitoring": ("info", "static")}
TARGETS = ["clip-after-step"]


def test_fixed_when_every_target_is_gone_and_nothing_is_worse() -> None:
    result = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side({**BUG, "grad-param-ratio": ("warning", "runtime")}),
        after=side(
            {"no-grad-monitoring": ("info", "static"), "grad-param-ratio": ("warning", "runtime")}
        ),
    )
    assert result.status == "fixed"
    assert result.resolved == ["clip-after-step"]
    assert result.remaining == ["no-grad-monitoring", "grad-param-ratio"]
    assert result.new == [] and not result.unsafe and result.deterministic is True
    assert "`grad-param-ratio`" in result.verdict  # what the patch leaves is named


def test_improved_when_a_serious_problem_goes_but_a_target_stays() -> None:
    before = side({**BUG, "loss-diverging": ("critical", "runtime")})
    after = side(BUG)
    result = compare(patch=PATCH, targets=TARGETS, before=before, after=after)
    assert result.status == "improved" and result.resolved == ["loss-diverging"]


def test_worse_when_a_serious_problem_appears_or_grows() -> None:
    new = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side(BUG),
        after=side({"exploding-gradients": ("critical", "runtime")}),
    )
    assert new.status == "worse" and new.new == ["exploding-gradients"]
    grown = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side({**BUG, "dead-neurons": ("warning", "runtime")}),
        after=side({"dead-neurons": ("critical", "runtime")}),
    )
    assert grown.status == "worse"


def test_unchanged_when_nothing_serious_moves() -> None:
    result = compare(patch=PATCH, targets=TARGETS, before=side(BUG), after=side(BUG))
    assert result.status == "unchanged" and result.remaining == list(BUG)


@pytest.mark.parametrize("failure", ["script-error", "timeout", "no-training-loop"])
def test_broken_when_the_copy_fails_where_the_original_ran(failure: str) -> None:
    after = side({}, failure, start=None, message="NameError: name 'x' is not defined")
    result = compare(patch=PATCH, targets=TARGETS, before=side(BUG), after=after)
    assert result.status == "broken" and result.unsafe
    assert "NameError" in result.verdict


def test_two_failures_are_unchanged_if_alike_and_broken_if_not() -> None:
    before = side(BUG, "script-error", message="RuntimeError: unscale_() has already been called")
    same = side(BUG, "script-error", message="RuntimeError: unscale_() has already been called")
    other = side(BUG, "script-error", message="NameError: name 'scaler' is not defined")
    assert compare(patch=PATCH, targets=[], before=before, after=same).status == "unchanged"
    assert compare(patch=PATCH, targets=[], before=before, after=other).status == "broken"


def test_a_copy_that_now_runs_is_at_least_improved() -> None:
    before = side(BUG, "script-error", message="RuntimeError: boom")
    fixed = compare(patch=PATCH, targets=TARGETS, before=before, after=side({}))
    assert fixed.status == "fixed"
    partly = compare(patch=PATCH, targets=TARGETS, before=before, after=side(BUG))
    assert partly.status == "improved"


def test_a_patch_that_does_not_apply_is_broken_and_none_is_no_patch() -> None:
    stale = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side(BUG),
        after=side({}, status=None),  # type: ignore[arg-type]
        patch_error="the hunk at line 1 does not match the script's text",
    )
    assert stale.status == "broken" and stale.unsafe and stale.verdict.startswith("The hunk")
    nothing = compare(patch=None, targets=[], before=side(BUG), after=None, no_patch_reason="x")
    assert nothing.status == "no-patch" and nothing.after is None


def test_runs_that_start_apart_do_not_count_runtime_noise() -> None:
    before = side(BUG)
    after = side({"grad-param-ratio": ("warning", "runtime")}, start=[9.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    result = compare(patch=PATCH, targets=TARGETS, before=before, after=after)
    assert result.deterministic is False
    assert result.status == "fixed" and result.new == ["grad-param-ratio"]
    assert "not deterministic" in result.verdict
    assert any("did not start from the same weights" in note for note in result.notes)


def test_a_first_batch_holding_a_nan_starts_alike_in_both_runs() -> None:
    # The fingerprint sums the first batch: NaN in both runs (NaN never equals itself).
    start = [-0.82, 150.3, 1233.0, math.nan, math.nan, 1280.0]
    after = side({}, start=list(start))
    result = compare(patch=PATCH, targets=TARGETS, before=side(BUG, start=start), after=after)
    assert result.deterministic is True and result.status == "fixed"
    apart = side({}, start=[-0.82, 150.3, 1233.0, math.nan, 7.0, 1280.0])
    result = compare(patch=PATCH, targets=TARGETS, before=side(BUG, start=start), after=apart)
    assert result.deterministic is False


def test_the_scripts_own_seeding_is_reported() -> None:
    seeding = SeedingInfo(
        seed=0,
        seeded=["random", "torch", "numpy"],
        reseeds=[SeedCall(function="torch.manual_seed", seed="1234", where="/p/train.py:7")],
        reseed_count=1,
        start_fingerprint=START,
    )
    before = side(BUG).model_copy(update={"seeding": seeding})
    after = side({}).model_copy(update={"seeding": seeding})
    result = compare(patch=PATCH, targets=TARGETS, before=before, after=after)
    assert any("torch.manual_seed(1234) at train.py:7" in note for note in result.notes)
    assert any("seeded with 0" in note for note in result.notes)


def test_a_patch_that_drops_an_operation_from_the_run_is_worse_and_unsafe() -> None:
    # The clip moved into a branch that does not run: no clip, so no misplaced clip either.
    clipping = {"backward": 10, "clip": 9, "step": 10}
    result = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side(BUG, operations=clipping),
        after=side(
            {"no-grad-monitoring": ("info", "static")}, operations={"backward": 10, "step": 10}
        ),
    )
    assert result.status == "worse" and result.unsafe
    assert result.resolved == ["clip-after-step"]
    assert "never runs gradient clipping (the original ran it in 9 of 10 steps)" in result.verdict
    # Moving it, or swapping value clipping for norm clipping, keeps the family: fixed.
    for kept in (
        {"backward": 10, "clip": 10, "step": 10},
        {"backward": 10, "clip-value": 3, "step": 10},
    ):
        moved = compare(
            patch=PATCH,
            targets=TARGETS,
            before=side(BUG, operations=clipping),
            after=side({"no-grad-monitoring": ("info", "static")}, operations=kept),
        )
        assert moved.status == "fixed" and not moved.unsafe, moved.verdict
    # A copy that fails is judged broken as before, whatever it ran.
    failed = compare(
        patch=PATCH,
        targets=TARGETS,
        before=side(BUG, operations=clipping),
        after=side({}, "script-error", message="AttributeError: x", operations={}),
    )
    assert failed.status == "broken"


def test_a_loss_divided_by_the_patch_is_noted_so_values_are_not_compared() -> None:
    def run(first: float, **extra: Any) -> RunSide:
        return side(BUG, loss_first=first, loss_last=first / 2, **extra)

    divided = compare(patch=PATCH, targets=TARGETS, before=run(1.38), after=run(0.345))
    assert any("1/4 of the original's" in note for note in divided.notes)
    # Same values, a non-whole ratio, or runs that did not start alike: no such note.
    for after in (run(1.38), run(0.5), run(0.345, start=[9.0] * 6)):
        result = compare(patch=PATCH, targets=TARGETS, before=run(1.38), after=after)
        assert not any("of the original's" in note for note in result.notes)


def _probed(records: list[dict[str, Any]]) -> ProbeResult:
    parsed = [StepRecord.model_validate(r) for r in records]
    return ProbeResult(
        status="stopped",
        script="t.py",
        steps=len(parsed),
        steps_requested=len(parsed),
        sample_every=10,
        profile="default",
        records=parsed,
        total_norm=[r.total_norm for r in parsed],
        loss=[1.0] * len(parsed),
    )


def test_a_sides_norm_median_and_max_are_the_raw_norms_not_the_clipped_ones() -> None:
    # A clip between backward and step cut 4-8 to max_norm 1: the applied norm is 1.0 on
    # every step, the gradients the backward produced were not.
    clipped = [
        {
            "step": step,
            "grad_norms": [1.0],
            "total_norm": 1.0,
            "total_norm_before_clip": raw,
            "clip_max_norm": 1.0,
            "clipped": True,
            "events": ["zero-grad", "backward", "clip", "step"],
        }
        for step, raw in enumerate([4.0, 5.0, 8.0], start=1)
    ]
    facts = run_side([], _probed(clipped), steps_requested=3)
    assert facts.norm_median == 5.0 and facts.norm_max == 8.0
    assert facts.total_norm == [1.0, 1.0, 1.0]  # the series stays the applied one
    # A clip after the step measured gradients the update had already used: the applied norm
    # is this step's own; a GradScaler-skipped step (its overflow is no norm) is left out.
    late = [
        {
            "step": step,
            "grad_norms": [norm],
            "total_norm": norm,
            "total_norm_before_clip": 9.0,
            "clip_max_norm": 1.0,
            "events": ["clip", "zero-grad", "backward", "step"],
            "skipped": norm > 100,
        }
        for step, norm in enumerate([2.0, 3.0, 1e9, 7.0], start=1)
    ]
    facts = run_side([], _probed(late), steps_requested=4)
    assert facts.norm_median == 3.0 and facts.norm_max == 7.0
