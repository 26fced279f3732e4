"""accum-missing-zero-grad: no zero_grad() at all, so gradients add up across updates."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import raw_norm
from gradient_doctor.probes.runtime.signals.windows import accumulated, events


class AccumMissingZeroGrad(Signal):
    id = "accum-missing-zero-grad"
    severities = ("critical",)
    summary = "No zero_grad() ran and the same gradient tensors carried over between updates."
    reads = frozenset({"grad_norm"})
    optional = frozenset(
        {"grad_norm_before_clip", "grad_carried", "events", "grad_reused", "batches", "feeds"}
    )
    message = (
        "No zero_grad() ran and the same gradient tensors carried over from update to update "
        "for {count} steps: gradients keep adding up (total norm {first:.3g} at step 1, "
        "{last:.3g} at step {steps})."
    )
    advice = "Call optimizer.zero_grad() after each optimizer step{where}."
    rank = 35
    healthy: ClassVar[list[Example]] = [
        Example(
            "zero_grad every step",
            None,
            each={"events": ["zero-grad", "backward", "step"], "grad_reused": False},
            series={"grad_norm": [0.5, 0.5, 0.5, 0.5]},
        ),
    ]
    healthy += [
        Example(
            "zeroed in place by hand (no zero_grad call)",
            None,
            each={"events": ["backward", "step"], "grad_carried": False, "grad_reused": True},
            series={"grad_norm": [0.5, 0.5, 0.5, 0.5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "zero_grad once before the loop, gradients carried over",
            "critical",
            each={"events": ["backward", "backward", "step"], "feeds": 2},
            series={
                "grad_norm": [0.5, 1.0, 1.5, 2.0, 2.5],
                "grad_carried": [None, True, True, True, True],
            },
            steps={0: {"events": ["zero-grad", "backward", "backward", "step"]}},
            check={"step": 2},
        ),
        Example(
            "gradients never zeroed",
            "critical",
            each={"events": ["backward", "step"]},
            series={
                "grad_norm": [0.5, 1.0, 1.5, 2.0, 2.5],
                "grad_reused": [False, True, True, True, True],
            },
            check={"step": 2},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        later = run.steps[1:]
        if len(later) < 2:
            return
        known = [p for p in later if p.grad_carried is not None]
        if known:
            # Measured: the gradients were still non-zero when a step's first backward began.
            carried = [p for p in known if p.grad_carried]
            if len(carried) < 2 or len(carried) * 2 < len(known):
                return
        elif (
            not all(p.events is not None for p in run.steps)
            or any("zero-grad" in events(p) for p in run.steps)
            or not all(p.grad_reused for p in later)
        ):
            return
        norms = [raw_norm(p) or 0.0 for p in run.steps]
        where = " of the update branch" if accumulated(run) is not None else ""
        yield ctx.finding(
            self.id,
            "critical",
            self.message.format(
                count=len(later) + 1, first=norms[0], last=norms[-1], steps=len(norms)
            ),
            step=later[0].step,
            fix=self.advice.format(where=where),
            first_norm=norms[0],
            last_norm=norms[-1],
        )
