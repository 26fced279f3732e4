"""monitor-after-zero-grad: gradient norms read after the gradients were zeroed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import Event, FileModel, Unit
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    between,
    following,
    label,
    movable,
    placements,
    previous,
)


class MonitorAfterZeroGrad(Rule):
    id = "monitor-after-zero-grad"
    severity = "warning"
    message = (
        "`{read}` on line {read_line} reads gradient norms after `{zero_grad}` on line "
        "{zero_line}: the gradients are already zero (or None), so the logged norm is always 0"
    )
    what = (
        "Finds gradient-norm logging placed after `zero_grad()` in the same iteration, or (for a "
        "call that only measures, such as `clip_grad_value_(params, None)` in a VITS-style "
        "helper) at the top of an iteration, before its first backward, when the iteration "
        "zeroes the gradients after its backward."
    )
    why = (
        "Once `zero_grad()` ran, `.grad` is zero or None until the next `backward()`. A norm "
        "read there reports 0 (or crashes on None) every step, hiding the real gradient "
        "behaviour you wanted to watch. Read norms after `backward()` and before `zero_grad()`."
    )
    example = "loss.backward()\noptimizer.step()\noptimizer.zero_grad()\nlog_grad_norm(model)\n"
    use_instead = "loss.backward()\nlog_grad_norm(model)\noptimizer.step()\noptimizer.zero_grad()\n"
    fix_safety = "Safe: the statement that reads the norms moves to just before `zero_grad()`."
    snippet_id = "grad-norm-monitor"
    valid: ClassVar[list[str]] = [
        """
for x, y in loader:
    loss_fn(model(x), y).backward()
    norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
    optimizer.step()
    optimizer.zero_grad()
""",
        """
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
    optimizer.step()
""",
        """
from helpers import grad_tools
for x, y in loader:
    loss_fn(model(x), y).backward()
    norm = grad_tools.clip_grad_value_(model.parameters(), None)
    optimizer.step()
    optimizer.zero_grad()
""",
        """
from helpers import grad_tools
for x, y in loader:
    optimizer.zero_grad()
    norm = grad_tools.clip_grad_norm_(model.parameters(), float("inf"))
    loss_fn(model(x), y).backward()
    optimizer.step()
""",
        # GradNorm-style weights: zero their gradients, then set them from a fresh
        # `torch.autograd.grad`, which reads no `.grad`.
        """
for batch in loader:
    optimizer.zero_grad()
    task_losses = model.task_losses(batch)
    (weights * task_losses).sum().backward(retain_graph=True)
    weight_optimizer.zero_grad()
    balance = (weights * task_losses).sum()
    weights.grad = torch.autograd.grad(balance, weights)[0]
    weight_optimizer.step()
    optimizer.step()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
from helpers import grad_tools
for i, (x, y) in enumerate(loader):
    logger.log("grad_norm", grad_tools.clip_grad_value_(model.parameters(), None))
    (loss_fn(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            4,
        ),
        Invalid(
            """
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
""",
            6,
        ),
        Invalid(
            """
def grad_norm(model):
    return sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)

for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    writer.add_scalar("grad_norm", grad_norm(model))
""",
            9,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            if unit.partial:
                continue
            measuring = [c for c in unit.of_kind("clip") if c.measures_only]
            for read in [*unit.of_kind("norm_read"), *measuring]:
                zero = previous(unit, read, {"zero_grad"})
                if zero is None and read.kind == "clip":
                    finding = self._before_first_backward(unit, read)
                    if finding is not None:
                        yield finding
                    continue
                if zero is None or between(unit, zero, read, {"backward"}):
                    continue
                backward = previous(unit, zero, {"backward"})
                if backward is None or _stored_earlier(unit, read, backward, zero):
                    continue
                read_at, zero_at = placements(read, zero)
                patch = None
                # A helper call that reads the norms may move: it only reads. A measuring
                # clip may read another model's gradients than the zero_grad clears (one
                # optimizer per network): not moved.
                if read.kind != "clip" and movable(read_at.stmt) and movable(zero_at.stmt):
                    patch = Patch().move_before(read_at.stmt, zero_at.stmt)
                node = read_at.node if isinstance(read_at.node, cst.Call) else read_at.stmt
                if isinstance(node, cst.SimpleStatementLine):
                    node = node.body[0]
                yield RawFinding(
                    node=node,
                    message=self.message,
                    evidence={
                        "read": label(node),
                        "read_line": node,
                        "zero_grad": label(zero_at.node),
                        "zero_line": zero_at.node,
                    },
                    patch=patch,
                    fix_description="Read the gradient norms before `zero_grad()`.",
                )

    def _before_first_backward(self, unit: Unit, read: Event) -> RawFinding | None:
        """A norm read at the top of an iteration, before its first backward, in an
        iteration that zeroes the gradients after its backward: from the second iteration on
        it reads what the last ``zero_grad`` left (zeros, None, or a partial accumulation).
        Only measuring clips (``clip_grad_value_(params, None)``, an infinite limit), which
        return the norm they read; no patch (where the read belongs is after the backward of
        the network it measures, which the analyser does not tie to one optimizer)."""
        if previous(unit, read, {"backward"}) is not None:
            return None
        backward = following(unit, read, {"backward"})
        zero = following(unit, backward, {"zero_grad"}) if backward is not None else None
        if zero is None:
            return None
        read_at, zero_at = placements(read, zero)
        node = read_at.node if isinstance(read_at.node, cst.Call) else read_at.stmt
        return RawFinding(
            node=node,
            message=WRAPPED_MESSAGE,
            evidence={
                "read": label(node),
                "read_line": node,
                "zero_grad": label(zero_at.node),
                "zero_line": zero_at.node,
                "backward_line": backward.anchor if backward is not None else node,
            },
        )


WRAPPED_MESSAGE = (
    "`{read}` on line {read_line} reads gradient norms before this iteration's backward (line "
    "{backward_line}), so it sees what `{zero_grad}` on line {zero_line} left at the end of the "
    "previous one: zeros or None (or a partial accumulation), never this step's gradients"
)


def _stored_earlier(unit: Unit, read: Event, backward: Event, zero: Event) -> bool:
    """``tracker.grad_norms()`` after ``zero_grad`` on an object whose own norm call
    (``tracker.update_grad_norms()``) already ran between the backward and the ``zero_grad``:
    the object measured the live gradients then, and the later call returns what it stored."""
    if read.receiver is None:
        return False
    return any(
        earlier.receiver == read.receiver
        for earlier in between(unit, backward, zero, {"norm_read"})
    )
