"""loss-diverging: the loss climbs far above its best value while updates keep being applied.

The step size is the first suspect (TD: a loss spike means a learning rate too high; GM lists
a high learning rate first among the causes of exploding gradients), so the finding names the
learning rate and the warmup seen, and its advice starts with them. Only single-objective runs
are judged: with two optimizers (a GAN, actor-critic), each loss is adversarial and may rise by
design. Losses that go negative (policy-gradient surrogates) have no "far above the best".
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, Severity, evidence_number
from gradient_doctor.probes.runtime.signals.base import UPDATE_INFLATING, Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite import origin_text
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.stats import is_nonfinite, loss_bad, step_loss
from gradient_doctor.probes.runtime.signals.step_size import (
    lower_lr_hint,
    lr_story,
    nan_loss_from_step_size,
    sentence,
)

#: Fewer finite losses than this say nothing about a trend.
MIN_STEPS = 6
NAN = float("nan")
RISING = [4.2, 4.0, 3.9, 3.9, 4.5, 6.0, 8.0, 11.0, 13.0, 15.0, 14.0, 15.0]


def smoothed(values: list[float]) -> list[float]:
    """Running median of three (one lucky or unlucky batch is not the best or the worst of
    the run); the first and last values, which have one neighbour only, take the median of
    the first and of the last three."""
    if len(values) < 3:
        return list(values)
    inner = [statistics.median(values[i - 1 : i + 2]) for i in range(1, len(values) - 1)]
    return [statistics.median(values[:3]), *inner, statistics.median(values[-3:])]


class LossDiverging(Signal):
    id = "loss-diverging"
    severities = ("warning", "critical")
    summary = (
        "Recent loss above loss_diverging_warning × the best (smoothed) loss of the run and "
        "above the first loss, while the optimizer keeps stepping."
    )
    reads = frozenset({"loss"})
    optional = frozenset(
        {
            "losses",
            "lr",
            "skipped",
            "optimizer_kinds",
            # the oversized update before a non-finite loss (step_size.blowup_before)
            "update_ratios",
            "param_norms",
            "param_layers",
            "weight_layers",
            "nan_origin",
        }
    )
    thresholds = ("loss_diverging_warning", "loss_diverging_critical")
    message = (
        "The loss climbed to {recent:.4g} (median of the last {window} steps) from its best "
        "{best:.4g} at step {best_step} ({ratio:.3g}×; it started at {first:.4g}) while updates "
        "kept being applied. {lr_story}."
    )
    recovered_message = (
        "The loss blew up to {peak:.4g} at step {peak_step}, {rise:.3g}× its best {best:.4g} "
        "before that (step {best_step}), and only came back later (median of the last "
        "{window} steps: {recent:.4g}). {lr_story}."
    )
    advice = (
        "Reduce the step size first: a lower peak learning rate{lower} and a warmup of a few "
        "hundred steps; then keep norm clipping as a guard against single spikes (clipping and "
        "architecture changes do not fix a step size that is too large)."
    )
    overflow_message = (
        "The loss given to backward() became {loss} at step {step}{was}. Before that, "
        "{blowup}: steps far too large for the weights blew them up until the forward "
        "overflowed, so the loss computation is not the cause. {lr_story}."
    )
    rank = 45
    consults = tuple(UPDATE_INFLATING)
    healthy: ClassVar[list[Example]] = [
        Example(
            "an early transient that recovered below the start (LR x100, no warmup)",
            None,
            series={
                "loss": [
                    3.25,
                    3.53,
                    4.59,
                    4.89,
                    4.61,
                    5.25,
                    4.3,
                    3.67,
                    3.28,
                    3.45,
                    3.35,
                    3.37,
                    3.16,
                    3.11,
                    2.95,
                    2.93,
                    2.91,
                    2.96,
                    2.94,
                    2.95,
                    2.98,
                    2.93,
                    2.83,
                    2.84,
                    2.81,
                    2.85,
                    2.82,
                    2.87,
                    2.82,
                    2.79,
                ],
            },
        ),
        Example("a falling loss", None, series={"loss": [4.2 - 0.1 * s for s in range(12)]}),
        Example(
            "batch noise around a flat loss: a lucky first and an unlucky last batch are not a "
            "best and a peak (HF Trainer, 8 samples a batch, lr 5e-5)",
            None,
            series={
                "loss": [
                    3.85,
                    5.34,
                    6.78,
                    5.85,
                    15.31,
                    4.06,
                    2.62,
                    12.93,
                    4.85,
                    9.61,
                    6.36,
                    4.9,
                    4.84,
                    2.25,
                    4.53,
                    4.26,
                    5.93,
                    8.41,
                    3.36,
                    5.76,
                    4.76,
                    2.31,
                    7.45,
                    13.15,
                ],
                "lr": [5e-5 * (1 - s / 24) for s in range(24)],
            },
        ),
        Example(
            "a late noisy batch many times a loss close to zero (still below the start)",
            None,
            series={
                "loss": [
                    3.5,
                    3.0,
                    2.0,
                    1.0,
                    0.5,
                    0.2,
                    0.08,
                    0.04,
                    0.05,
                    0.3,
                    0.35,
                    0.1,
                    0.07,
                    0.06,
                    0.08,
                    0.07,
                ]
            },
        ),
        Example(
            "a noisy plateau",
            None,
            series={"loss": [2.3, 2.1, 2.4, 2.2, 2.35, 2.15, 2.3, 2.25, 2.4, 2.2, 2.3, 2.35]},
        ),
        Example(
            "falls, then rises a little, still below the start",
            None,
            series={"loss": [3.0, 2.0, 1.2, 1.0, 1.0, 1.1, 1.3, 1.6, 1.8, 1.9, 2.0, 2.1]},
        ),
        Example(
            "a GAN's generator loss rises by design",
            None,
            series={"loss": RISING, "optimizer": [1] * 12},
            run={"optimizer_kinds": ["Adam", "Adam"]},
            steps={0: {"optimizer": 0, "loss": 0.7}},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "blew up to 6x, partly recovered, still twice the start (nanoGPT, LR x1000)",
            "critical",
            series={
                "loss": [
                    3.25,
                    3.42,
                    5.86,
                    6.48,
                    7.48,
                    8.21,
                    3.93,
                    9.13,
                    6.88,
                    8.89,
                    9.94,
                    18.09,
                    19.23,
                    7.88,
                    8.94,
                    9.95,
                    13.45,
                    10.53,
                    10.61,
                    10.83,
                    12.29,
                    8.65,
                    8.96,
                    8.95,
                    6.27,
                    6.97,
                    9.07,
                    5.58,
                    4.59,
                    6.31,
                ],
                "lr": [1.0] * 30,
            },
            check={"peak_step": 12},
        ),
        Example(
            "blew up 19x in the first steps, came back as the learning rate decayed (HF, lr 3)",
            "warning",
            series={
                "loss": [
                    86.0,
                    1534.0,
                    1658.0,
                    900.0,
                    310.0,
                    95.0,
                    40.0,
                    12.0,
                    6.0,
                    4.0,
                    3.0,
                    2.5,
                    2.0,
                    1.8,
                    1.6,
                    1.7,
                ],
                "lr": [2.98 - 0.18 * s for s in range(16)],
            },
            check={"peak_step": 2, "best_step": 1, "recovered": True},
        ),
        Example(
            "LR x100 with a warmup: 4.2 to 15",
            "critical",
            series={"loss": RISING, "lr": [0.01 * min(s + 1, 10) for s in range(12)]},
            check={
                "best_step": 3,
                "learning_rate": {"lr": 0.1, "lr_first": 0.01, "lr_last": 0.1, "warmup_steps": 10},
            },
        ),
        Example(
            "rising to 2.5x the best, no learning rate known",
            "warning",
            series={"loss": [2.0, 1.5, 1.2, 1.0, 1.0, 1.3, 1.8, 2.2, 2.5, 2.6, 2.5, 2.6]},
        ),
        Example(
            "one update ~100x the weights, then a NaN loss (float16 overflow, AdamW lr 3)",
            "critical",
            series={
                "loss": [2.08, NAN, NAN, NAN, NAN],
                "update_ratios": [
                    {"fc1": 117.0, "fc2": 40.0, "head": 30.0},
                    None,
                    None,
                    None,
                    None,
                ],
                "lr": [3.0] * 5,
            },
            check={"step": 2, "blowup_step": 1, "module": "fc1"},
        ),
        Example(
            "climbing, then NaN",
            "critical",
            series={"loss": [4.0, 3.5, 3.3, 3.4, 5.0, 9.0, 20.0, NAN], "lr": [1.0] * 8},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = list(self._climbed(run, ctx))
        if found:
            yield from found
            return
        yield from self._overflowed(run, ctx)

    def _overflowed(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        """The loss went non-finite within a few steps of an update far larger than the
        weights (too few finite losses for a trend): one oversized step blew the weights up
        and the forward overflowed (float16 first). The loss computation is not the cause."""
        cause = nan_loss_from_step_size(run, ctx)
        if cause is None:
            return
        point, blowup = cause
        applied = [p for p in run.steps if not p.skipped]
        finite = [(p.step, loss) for p in run.steps if (loss := step_loss(p)) is not None]
        before = [(s, v) for s, v in finite if s < point.step]
        loss = next(v for v in (point.losses or [point.loss]) if is_nonfinite(v))
        story, numbers = lr_story(applied)
        was = ""
        if len(before) > 1:
            was = (
                f" (it started at {before[0][1]:.4g}, {before[-1][1]:.4g} at step {before[-1][0]})"
            )
        elif before:
            was = f" (it was {before[0][1]:.4g} at step {before[0][0]})"
        origin, module = origin_text(run, point.step)
        yield ctx.finding(
            self.id,
            "critical",
            self.overflow_message.format(
                step=point.step,
                loss=evidence_number(loss),
                was=was,
                blowup=blowup.text(),
                lr_story=sentence(story),
            )
            + origin,
            step=point.step,
            module=blowup.layer,
            fix=ctx.step_size_advice(self.advice.format(lower=lower_lr_hint(numbers))),
            nonfinite_step=point.step,
            last_finite_loss=before[-1][1] if before else None,
            blowup_step=blowup.step,
            blowup_kind=blowup.kind,
            blowup_factor=blowup.factor,
            blowup_median=blowup.median,
            layers_above=blowup.above,
            traced_module=module,
            learning_rate=numbers,
        )

    def _climbed(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        """The loss climbed far above its best (or blew up and came back)."""
        if len(run.optimizers()) > 1:
            return  # adversarial or multi-objective losses: no single best to diverge from
        applied = [p for p in run.steps if not p.skipped]
        values = [(p, loss) for p in applied if (loss := step_loss(p)) is not None]
        if len(values) < MIN_STEPS or any(loss <= 0 for _, loss in values):
            return
        blew_up = next((p for p in applied if loss_bad(p)), None)
        if blew_up is not None:
            values = [(p, loss) for p, loss in values if p.step < blew_up.step]
            if len(values) < MIN_STEPS // 2:
                return
        losses = [loss for _, loss in values]
        smooth = smoothed(losses)
        window = max(3, len(losses) // 6)
        recent = statistics.median(losses[-window:])
        best_index = min(range(len(smooth) - window), key=lambda i: smooth[i], default=None)
        if best_index is None:
            return
        best = smooth[best_index]
        first = statistics.median(losses[:3])
        ratio = recent / best
        warn = ctx.threshold("loss_diverging_warning")
        crit = ctx.threshold("loss_diverging_critical")
        # The highest (smoothed) loss after the best: a blow-up that partly recovered is still
        # one while the loss stays above where the run started.
        peak_index = max(range(best_index + 1, len(smooth)), key=lambda i: smooth[i])
        peak = smooth[peak_index]
        spiked = peak / best > crit
        if recent <= first or not (ratio > warn or spiked):
            yield from self._recovered(smooth, values, window, recent, applied, ctx)
            return
        severity: Severity = (
            "critical" if ratio > crit or spiked or blew_up is not None else "warning"
        )
        onset = next(
            (p for (p, loss) in values[best_index + 1 :] if loss > warn * best),
            values[-window][0],
        )
        story, numbers = lr_story(applied)
        lower = lower_lr_hint(numbers)
        message = self.message.format(
            recent=recent,
            window=window,
            best=best,
            best_step=values[best_index][0].step,
            ratio=ratio,
            first=losses[0],
            lr_story=sentence(story),
        )
        if spiked and peak > recent:
            message += (
                f" It had peaked at {peak:.4g} at step {values[peak_index][0].step} "
                f"({peak / best:.3g}× the best)."
            )
        if blew_up is not None:
            message += f" At step {blew_up.step} the loss became non-finite."
        yield ctx.finding(
            self.id,
            severity,
            message,
            step=onset.step,
            fix=ctx.step_size_advice(self.advice.format(lower=lower)),
            recent_loss=recent,
            best_loss=best,
            best_step=values[best_index][0].step,
            first_loss=first,
            ratio=ratio,
            peak_loss=peak,
            peak_step=values[peak_index][0].step,
            nonfinite_step=blew_up.step if blew_up is not None else None,
            threshold_warning=warn,
            threshold_critical=crit,
            learning_rate=numbers,
        )

    def _recovered(
        self,
        smooth: list[float],
        values: list[tuple[StepPoint, float]],
        window: int,
        recent: float,
        applied: list[StepPoint],
        ctx: Context,
    ) -> Iterator[Finding]:
        """A blow-up the run came back from (a decaying learning rate, a lucky recovery): the
        smoothed loss rose above loss_diverging_critical × its best so far, then fell again.
        A warning: the run trains now, but the step size threw away what came before."""
        crit = ctx.threshold("loss_diverging_critical")
        # The reference is the smoothed loss before the peak, or the first loss itself: a
        # blow-up in the first steps leaves no smoothed value before it.
        lows = [values[0][1], *smooth[1:]]
        best_index, rise, peak_index = 0, 1.0, 0
        low_index = 0
        for index in range(1, len(smooth)):
            if lows[index - 1] < lows[low_index]:
                low_index = index - 1
            if lows[low_index] > 0 and smooth[index] / lows[low_index] > rise:
                best_index, rise, peak_index = low_index, smooth[index] / lows[low_index], index
        # Above the first loss too: late in a healthy run a noisy batch can be many times a
        # loss that fell close to zero.
        if rise <= crit or smooth[peak_index] <= values[0][1]:
            return
        story, numbers = lr_story(applied)
        lower = lower_lr_hint(numbers)
        yield ctx.finding(
            self.id,
            "warning",
            self.recovered_message.format(
                peak=smooth[peak_index],
                peak_step=values[peak_index][0].step,
                rise=rise,
                best=lows[best_index],
                best_step=values[best_index][0].step,
                window=window,
                recent=recent,
                lr_story=sentence(story),
            ),
            step=values[peak_index][0].step,
            fix=ctx.step_size_advice(self.advice.format(lower=lower)),
            recent_loss=recent,
            best_loss=lows[best_index],
            best_step=values[best_index][0].step,
            ratio=rise,
            peak_loss=smooth[peak_index],
            peak_step=values[peak_index][0].step,
            recovered=True,
            threshold_critical=crit,
            learning_rate=numbers,
        )
