"""exploding-gradients: the total gradient norm above the profile's exploding thresholds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, Severity
from gradient_doctor.probes.runtime.signals.base import UPDATE_INFLATING, Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.stats import raw_norm

#: Findings that say the clip did not act on the gradients the optimizer used.
MISPLACED_CLIP = ("clip-after-step", "clip-before-backward")


class ExplodingGradients(Signal):
    id = "exploding-gradients"
    severities = ("warning", "critical")
    summary = "The total gradient norm goes above exploding_warning (critical above _critical)."
    reads = frozenset({"grad_norm"})
    optional = frozenset({"grad_norm_before_clip", "clipped"})
    thresholds = ("exploding_warning", "exploding_critical")
    message = (
        "Total gradient norm reached {peak:.4g} at step {step} ({above} of {steps} steps above "
        "{warn:g}; critical above {crit:g})."
    )
    advice = (
        "Clip the total norm after backward() and before the step (max_norm 1.0 for "
        "Transformers, 5–10 for RNNs) and check the learning rate."
    )
    per_optimizer = True
    rank = 50
    consults = (*MISPLACED_CLIP, *UPDATE_INFLATING, "loss-diverging")
    diverging_advice = (
        "The loss is diverging with it: reduce the step size first (learning rate, warmup), "
        "then keep norm clipping between backward() and the step as a guard."
    )
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example("norms around 1", None, series={"grad_norm": [1.2, 0.9, 1.1, 1.0, 0.8]}),
        Example(
            "GradScaler overflow steps are skipped, not exploding",
            None,
            each={"events": ["scale", "backward", "scaler-step", "scaler-update"]},
            series={
                "grad_norm": [float("inf"), float("inf"), 0.9, 1.1, float("inf"), 1.0],
                "skipped": [True, True, False, False, True, False],
                "scale": [65536.0, 32768.0, 16384.0, 16384.0, 16384.0, 8192.0],
            },
        ),
        Example(
            "a clip on scaled gradients saw 3e4 at scale 65536: recorded unscaled, 0.46",
            None,
            each={
                "events": ["scale", "backward", "clip", "scaler-step", "step"],
                "grad_norm_before_clip": 0.46,
                "scale": 65536.0,
                "clipped": True,
                "clip_max_norm": 1.0,
            },
            series={"grad_norm": [1e-5, 1e-5, 1e-5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "norms at 150",
            "warning",
            series={"grad_norm": [150.0, 160.0, 150.0, 140.0, 150.0]},
            check={"step": 2, "steps_above": 5},
        ),
        Example(
            "norms at 2000",
            "critical",
            series={"grad_norm": [2000.0, 2100.0, 1900.0]},
            check={"peak_norm": 2100.0},
        ),
        Example(
            "the gs profile warns from 10",
            "warning",
            profile="gs",
            series={"grad_norm": [30.0, 30.0, 30.0, 30.0, 30.0]},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        # Unscaled norms of the applied steps: a GradScaler-skipped step's Inf is an overflow
        # the scaler handled (amp-overflow-skips), not an explosion.
        norms: list[tuple[float, StepPoint]] = [
            (norm, p) for p in run.steps if (norm := raw_norm(p)) is not None
        ]
        if not norms:
            return
        peak, peak_point = max(norms, key=lambda item: item[0])
        warn = ctx.threshold("exploding_warning")
        crit = ctx.threshold("exploding_critical")
        if peak <= warn:
            return
        above = sum(1 for n, _ in norms if n > warn)
        severity: Severity = "critical" if peak > crit else "warning"
        # A clip outside backward..step changes nothing the optimizer uses.
        clipped = (
            not ctx.has(*MISPLACED_CLIP)
            and bool(peak_point.clipped)
            and (peak_point.grad_norm or 0.0) <= warn
        )
        if clipped and severity == "critical":
            severity = "warning"
        yield ctx.finding(
            self.id,
            severity,
            self.message.format(
                peak=peak, step=peak_point.step, above=above, steps=len(norms), warn=warn, crit=crit
            )
            + (" The script's clipping contained it." if clipped else ""),
            step=peak_point.step,
            fix=ctx.step_size_advice(
                self.diverging_advice if ctx.has("loss-diverging") else self.advice
            ),
            peak_norm=peak,
            steps_above=above,
            steps=len(norms),
            threshold_warning=warn,
            threshold_critical=crit,
        )
