"""no-grad-monitoring: a training loop that never measures gradient norms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.ruletools import label


class NoGradMonitoring(Rule):
    id = "no-grad-monitoring"
    severity = "info"
    message = (
        "the training loop with `{backward}` on line {backward_line} never measures gradient "
        "norms: explosions, vanishing gradients and NaNs will only show up in the loss, late"
    )
    what = "Finds training loops that never read a gradient norm."
    why = (
        "The total gradient norm is the earliest and cheapest signal of trouble: it spikes "
        "before the loss does, shows vanishing gradients the loss hides, and tells you what "
        "`max_norm` to use. `clip_grad_norm_` already returns it, so logging it is free."
    )
    example = "loss.backward()\noptimizer.step()\n"
    use_instead = (
        "loss.backward()\n"
        "grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "log({'grad_norm': grad_norm.item()})\n"
        "optimizer.step()\n"
    )
    fix_safety = "No automatic fix: where to log is your choice; see the grad-norm-monitor snippet."
    snippet_id = "grad-norm-monitor"
    valid: ClassVar[list[str]] = [
        """
import torch
for x, y in loader:
    loss_fn(model(x), y).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    print(float(grad_norm))
    optimizer.step()
    optimizer.zero_grad()
""",
        """
for x, y in loader:
    loss_fn(model(x), y).backward()
    total = sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5
    optimizer.step()
    optimizer.zero_grad()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
""",
            3,
        ),
        Invalid(
            """
import torch
def train(model, loader, opt):
    for batch in loader:
        loss = model(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
""",
            6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        if model.monitoring_calls:
            return
        for event in model.direct_events():
            if event.kind == "norm_read" or (event.kind == "clip" and event.result_used):
                return
        for unit in model.units:
            if not unit.steps or not unit.backwards or unit.framework is not None:
                continue
            backward = unit.backwards[0]
            yield RawFinding(
                node=backward.call,
                message=self.message,
                evidence={"backward": label(backward.call), "backward_line": backward.call},
            )
