"""accum-unscaled-loss: N backward() calls per step with a loss not divided by N."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.windows import (
    RAW_LOSS_OP,
    SCALED_LOSS_OPS,
    accumulated,
    micro_batches,
)

MICRO = ["zero-grad", "backward", "backward", "backward", "backward", "step"]


class AccumUnscaledLoss(Signal):
    id = "accum-unscaled-loss"
    severities = ("critical",)
    summary = "Accumulated steps whose micro-batch losses reach backward() undivided."
    reads = frozenset({"events", "loss_ops"})
    optional = frozenset({"batches", "feeds"})
    message = (
        "{micro:g} backward() calls per optimizer step, and the loss reaches backward() "
        "straight from `{op}` without a division by the number of micro-batches: the "
        "accumulated gradient is ~{micro:g}× too large."
    )
    advice = (
        "Divide each micro-batch loss by the number of micro-batches ({micro:g}) before backward()."
    )
    rank = 30
    healthy: ClassVar[list[Example]] = [
        Example(
            "losses divided by 4",
            None,
            each={"events": MICRO, "loss_ops": ["DivBackward0"] * 4, "losses": [1.0] * 4},
            series={"loss": [1.0] * 4},
        ),
    ]
    healthy += [
        Example(
            "a GAN discriminator: real and fake backward() on one batch",
            None,
            each={
                "events": ["zero-grad", "backward", "backward", "step"],
                "loss_ops": ["BinaryCrossEntropyBackward0"] * 2,
                "batches": 1,
            },
            series={"loss": [1.0] * 4},
        ),
        Example(
            "two losses of one forward, no DataLoader",
            None,
            each={
                "events": ["zero-grad", "backward", "backward", "step"],
                "loss_ops": ["MseLossBackward0", "NllLossBackward0"],
                "feeds": 1,
            },
            series={"loss": [1.0] * 4},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "raw MSE losses, 4 micro-batches",
            "critical",
            each={"events": MICRO, "loss_ops": ["MseLossBackward0"] * 4, "losses": [1.0] * 4},
            series={"loss": [1.0] * 4},
            check={"step": 1, "backward_per_step": 4.0, "loss_op": "MseLossBackward0"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        windows = accumulated(run)
        if windows is None:
            return
        micro = micro_batches(windows)
        ops = [op for p in windows for op in p.loss_ops or ()]
        raw = [op for op in ops if RAW_LOSS_OP.search(op) and op not in SCALED_LOSS_OPS]
        if ops and len(raw) * 2 > len(ops):
            yield ctx.finding(
                self.id,
                "critical",
                self.message.format(micro=micro, op=raw[0]),
                step=windows[0].step,
                fix=self.advice.format(micro=micro),
                backward_per_step=micro,
                loss_op=raw[0],
            )
