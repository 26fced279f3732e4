"""accum-missing-zero-grad: an accumulation loop that never zeroes the gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import accumulating_units, label, optimizer_of


class AccumMissingZeroGrad(Rule):
    id = "accum-missing-zero-grad"
    severity = "critical"
    message = (
        "the accumulation update `{step}` on line {step_line} never zeroes the gradients: "
        "they keep growing across updates; call `{optimizer}.zero_grad()` after the step"
    )
    what = "Finds accumulation loops whose update steps but never calls `zero_grad()`."
    why = (
        "`backward()` adds into `.grad`. With no `zero_grad()` after the update, the next window "
        "starts from the old sum, so every update uses all gradients since the start: the "
        "effective accumulation count grows without bound and training diverges."
    )
    example = (
        "for i, batch in enumerate(loader):\n"
        "    (model(batch).loss / N).backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        optimizer.step()\n"
    )
    use_instead = (
        "for i, batch in enumerate(loader):\n"
        "    (model(batch).loss / N).backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    fix_safety = "Safe: `optimizer.zero_grad()` is inserted right after the update's step."
    snippet_id = "accumulation"
    valid: ClassVar[list[str]] = [
        """
for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    if (i + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        """
for epoch in range(epochs):
    for i, batch in enumerate(loader):
        if i % N == 0:
            optimizer.zero_grad(set_to_none=True)
        (model(batch).loss / N).backward()
        if i % N == N - 1:
            optimizer.step()
""",
        """
for it in range(iters):
    for p in model.parameters():
        p.grad = None
    for micro in range(N):
        (model(next(data)) / N).backward()
    optimizer.step()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    if (i + 1) % N == 0:
        optimizer.step()
""",
            5,
        ),
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler("cuda")
optimizer.zero_grad()
for it in range(iters):
    for micro in range(accum):
        scaler.scale(model(next(data)) / accum).backward()
    scaler.step(optimizer)
    scaler.update()
""",
            8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit, acc, steps in accumulating_units(model, skip_deepspeed=True):
            if unit.of_kind("zero_grad"):
                continue
            step = steps[0]
            optimizer = optimizer_of(step) or "optimizer"
            anchor = step.stmt
            following = [
                e
                for e in unit.of_kind("scaler_update")
                if e.order > step.order and e.frames == step.frames and e.chain == step.chain
            ]
            if following:
                anchor = following[0].stmt
            yield RawFinding(
                node=step.call,
                message=self.message,
                evidence={
                    "step": label(step.call),
                    "step_line": step.call,
                    "optimizer": optimizer,
                    "divisor": acc.divisor_text,
                },
                patch=Patch().insert_after(anchor, f"{optimizer}.zero_grad()"),
                fix_description=f"Insert `{optimizer}.zero_grad()` after the update.",
            )
