"""accum-manual-grad-scaling: dividing ``p.grad`` by hand instead of scaling the loss."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.names import code_of


class AccumManualGradScaling(Rule):
    id = "accum-manual-grad-scaling"
    severity = "info"
    message = (
        "line {grad_line} divides the gradients by hand (`{statement}`); divide the loss by "
        "`{divisor}` before `backward()` instead"
    )
    what = "Finds accumulation code that rescales `.grad` tensors instead of the loss."
    why = (
        "Dividing every parameter's `.grad` after accumulating gives the same numbers as "
        "dividing the loss, but it is an extra pass over all parameters, it is easy to miss "
        "parameters or to run it at the wrong moment (after clipping, on the wrong micro-step), "
        "and it interacts badly with AMP scaling. Scaling the loss is the standard form."
    )
    example = (
        "loss.backward()\n"
        "if (i + 1) % N == 0:\n"
        "    for p in model.parameters():\n"
        "        p.grad /= N\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "(loss / N).backward()\n"
        "if (i + 1) % N == 0:\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
    )
    fix_safety = "No automatic fix: both the division and the loss need to change together."
    snippet_id = "accumulation"
    valid: ClassVar[list[str]] = [
        """
for i, (x, y) in enumerate(loader):
    (loss_fn(model(x), y) / N).backward()
    if (i + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        """
import torch.distributed as dist
for x, y in loader:
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size
    optimizer.step()
    optimizer.zero_grad()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
for i, (x, y) in enumerate(loader):
    loss_fn(model(x), y).backward()
    if (i + 1) % N == 0:
        for p in model.parameters():
            p.grad /= N
        optimizer.step()
        optimizer.zero_grad()
""",
            6,
        ),
        Invalid(
            """
for it in range(iters):
    for micro in range(accumulation_steps):
        model(next(data)).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(accumulation_steps)
    optimizer.step()
    optimizer.zero_grad()
""",
            7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            acc = unit.accumulation
            for event in unit.of_kind("grad_div"):
                text = code_of(event.call)
                if "world" in text.lower() or "rank" in text.lower():
                    continue
                divisor = acc.divisor_text if acc is not None else None
                if divisor is None and "accum" not in text.lower():
                    continue
                if divisor is not None and divisor not in text and "accum" not in text.lower():
                    continue
                yield RawFinding(
                    node=event.call,
                    message=self.message,
                    evidence={
                        "grad_line": event.call,
                        "statement": text if len(text) < 60 else text[:57] + "...",
                        "divisor": divisor or "N",
                    },
                )
