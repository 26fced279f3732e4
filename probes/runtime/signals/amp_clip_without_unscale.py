"""amp-clip-without-unscale: the clip ran on GradScaler-scaled gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import events

SCALED_CLIP = ["zero-grad", "scale", "backward", "clip", "scaler-step", "step"]
UNSCALED_CLIP = ["zero-grad", "scale", "backward", "unscale", "clip", "scaler-step", "step"]
#: The clip of the previous step ran after its scaler.step (which unscaled the gradients
#: itself), so it is seen at the start of the next step's calls: no scaled gradients.
CLIP_AFTER_SCALER_STEP = ["scaler-update", "clip", "zero-grad", "scale", "backward", "scaler-step"]


def clip_on_scaled_gradients(calls: list[str]) -> bool:
    """Whether a norm clip in ``calls`` (one step's calls) ran on GradScaler-scaled gradients:
    after a scaled ``backward()`` of this step, before any ``unscale_`` and before the step.
    A clip after ``scaler.step()`` saw unscaled gradients: the step unscales them itself when
    the script did not (or, fused, the optimizer's kernel writes them back unscaled)."""
    if "scale" not in calls:
        return False
    for position, call in enumerate(calls):
        if call in ("scaler-step", "step", "unscale"):
            return False
        if call == "clip" and "backward" in calls[:position]:
            return True
    return False


class AmpClipWithoutUnscale(Signal):
    id = "amp-clip-without-unscale"
    severities = ("critical",)
    summary = "With a GradScaler, clipping ran with no scaler.unscale_ before it."
    reads = frozenset({"events"})
    optional = frozenset({"scale", "grad_norm_before_clip"})
    message = (
        "Clipping ran on GradScaler-scaled gradients (no scaler.unscale_ before it) in "
        "{count} step(s): the clip saw norm {seen} at scale {scale} (unscaled {norm}), so it "
        "clips ~scale× too hard and the real update is tiny."
    )
    advice = "Call scaler.unscale_(optimizer) right before clip_grad_norm_."
    rank = 40
    healthy: ClassVar[list[Example]] = [
        Example(
            "unscale_ before the clip",
            None,
            each={"events": UNSCALED_CLIP, "scale": 65536.0, "grad_norm_before_clip": 0.5},
            series={"grad_norm": [0.5, 0.5, 0.5]},
        ),
        Example(
            "a clip after scaler.step (clip-after-step's finding, not this one)",
            None,
            each={
                "events": CLIP_AFTER_SCALER_STEP,
                "scale": 65536.0,
                "grad_norm_before_clip": 18.3,
                "clip_max_norm": 1.0,
                "clipped": True,
            },
            series={"grad_norm": [18.0, 17.2, 16.9]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "clip on scaled gradients",
            "critical",
            each={
                "events": SCALED_CLIP,
                "scale": 65536.0,
                "grad_norm_before_clip": 0.5,
                "clip_max_norm": 1.0,
                "clipped": True,
            },
            series={"grad_norm": [1.5e-5, 1.5e-5, 1.5e-5]},
            check={"step": 1, "steps_affected": 3, "scale": 65536.0, "clip_saw_norm": 32768.0},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        steps = [p.step for p in run.steps if clip_on_scaled_gradients(events(p))]
        if not steps:
            return
        point = next(p for p in run.steps if p.step == steps[0])
        # The probe records the clip's reading unscaled; the clip itself compared scale× that.
        before, scale = point.grad_norm_before_clip, point.scale
        seen = before * scale if before is not None and scale else before
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(
                count=len(steps),
                seen=evidence_number(seen),
                norm=evidence_number(point.grad_norm_before_clip),
                scale=evidence_number(point.scale),
            ),
            step=steps[0],
            fix=self.advice,
            steps_affected=len(steps),
            scale=point.scale,
            clip_saw_norm=seen,
            unscaled_norm=before,
        )
