"""nan-loss-before-backward: the loss was already non-finite when backward() received it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding, evidence_number
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.nonfinite import first_bad, origin_text
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint
from gradient_doctor.probes.runtime.signals.stats import is_nonfinite, norm_at
from gradient_doctor.probes.runtime.signals.step_size import nan_loss_from_step_size

NAN = float("nan")


class NanLossBeforeBackward(Signal):
    id = "nan-loss-before-backward"
    severities = ("critical",)
    summary = "The loss given to backward() was already NaN/Inf at the first bad step."
    reads = frozenset({"loss"})
    optional = frozenset(
        {
            "losses",
            "grad_norm",
            "grad_norm_before_clip",
            "nan_origin",
            "nonfinite_params",
            # an oversized update before it hands the finding to loss-diverging
            "update_ratios",
            "param_norms",
            "param_layers",
            "weight_layers",
            "lr",
            "optimizer_kinds",
        }
    )
    thresholds = ("exploding_critical",)
    message = "The loss given to backward() at step {step} was already {loss}: {cause}."
    advice = (
        "Make the loss numerically safe (epsilon in log/division, clamp, a fused built-in such "
        "as cross_entropy) and check that step's batch."
    )
    rank = 11
    consults = ("nan-parameters",)
    healthy: ClassVar[list[Example]] = [
        Example("finite loss", None, series={"loss": [2.0, 1.8, 1.7, 1.6]}),
        Example(
            "a NaN loss after an update ~100x the weights is loss-diverging's (the step size)",
            None,
            series={
                "loss": [2.08, NAN, NAN, NAN],
                "update_ratios": [{"fc1": 117.0, "fc2": 40.0, "head": 30.0}, None, None, None],
                "lr": [3.0] * 4,
            },
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "the loss turns NaN at step 3 with calm gradients before",
            "critical",
            series={"loss": [2.0, 1.8, NAN, NAN], "grad_norm": [0.5, 0.5, NAN, NAN]},
            check={"step": 3},
        ),
        Example(
            "a NaN loss after one large update in one layer of three (not the step size)",
            "critical",
            series={
                "loss": [2.08, NAN, NAN, NAN],
                "update_ratios": [{"fc1": 117.0, "fc2": 1e-3, "head": 1e-3}, None, None, None],
                "lr": [1e-3] * 4,
            },
            check={"step": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        found = first_bad(run)
        if found is None or found[0] != "loss":
            return
        if nan_loss_from_step_size(run, ctx) is not None:
            # An update far larger than the weights came first: the loss overflowed because
            # the weights blew up. loss-diverging reports that, with the step size first.
            return
        point = found[1]
        values = point.losses if point.losses is not None else [point.loss]
        loss = next(v for v in values if is_nonfinite(v))
        previous = norm_at(run, point.step - 1)
        if previous is not None and previous > ctx.threshold("exploding_critical"):
            cause = (
                f"the previous step's gradient norm was {previous:.3g}, so the weights grew "
                "until the loss overflowed: fix the explosion first"
            )
        elif run.source == "log":
            cause = None
        else:
            cause = "the loss computation is the problem, not the gradients; clipping cannot fix it"
        origin, module = origin_text(run, point.step)
        if cause is None:
            text = _log_message(run, point, loss)
        else:
            text = self.message.format(step=point.step, loss=evidence_number(loss), cause=cause)
        yield ctx.finding(
            self.id,
            "critical",
            text + origin,
            step=point.step,
            module=module,
            fix=self.advice,
            loss=loss,
            previous_step_norm=previous,
            origin=run.nan_origin.model_dump() if run.nan_origin else None,
        )


def _log_message(run: RunSeries, point: StepPoint, loss: float | None) -> str:
    """What a training log shows about its first non-finite loss, and only that.

    The probe sees the batch entering the forward, the loss given to ``backward()``, the
    gradients and the weights, in that order; a log shows a few logged values per line. So
    the sentence says which logged values were still finite at that step and names what the
    log could not show, instead of concluding that the loss computation is the cause."""
    step, shown = point.step, evidence_number(loss)
    norm = point.grad_norm
    if not run.has("grad_norm"):
        seen = f"The logged loss is {shown} at step {step}, the first non-finite value in the log."
        unseen = ["the gradient norm", "the batch (inputs)", "the weights"]
    elif norm is None:
        seen = (
            f"The logged loss is {shown} at step {step}, the first non-finite value in the log; "
            "no gradient norm is logged at that step."
        )
        unseen = ["the gradients at that step", "the batch (inputs)", "the weights"]
    elif is_nonfinite(norm):
        seen = (
            f"The logged loss ({shown}) and gradient norm ({evidence_number(norm)}) both turn "
            f"non-finite at step {step}, so the log cannot tell which came first."
        )
        unseen = ["the batch (inputs)", "the weights"]
    else:
        seen = (
            f"The logged loss is {shown} at step {step} while the gradient norm logged at that "
            f"step is still finite ({norm:.3g}): in this log the loss went non-finite first."
        )
        unseen = ["the batch (inputs)", "the weights"]
    return (
        f"{seen} The log does not show {', '.join(unseen[:-1])} or {unseen[-1]}, so it cannot "
        "tell a broken loss computation from a bad batch or weights broken earlier; "
        "`gradient-doctor probe` on the script checks them in that order."
    )
