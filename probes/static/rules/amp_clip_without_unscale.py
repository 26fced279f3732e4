"""amp-clip-without-unscale: clipping the still-scaled gradients of a GradScaler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import Event, FileModel, Unit
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    between,
    clipping,
    following,
    guarded_code,
    label,
    movable,
    optimizer_of,
    path_guard,
    placement,
    previous,
)


class AmpClipWithoutUnscale(Rule):
    id = "amp-clip-without-unscale"
    severity = "critical"
    message = (
        "`{clip}` on line {clip_line} clips the gradients scaled by `{scaler}` (backward on line "
        "{backward_line}) without `{scaler}.unscale_({optimizer})` first"
    )
    what = "Finds clipping of GradScaler-scaled gradients with no `scaler.unscale_()` before it."
    why = (
        "After `scaler.scale(loss).backward()` the gradients are multiplied by the loss scale "
        "(65,536 at the start). Their norm is far above `max_norm`, so every step is clipped to "
        "`max_norm` in scaled units, and once `scaler.step` divides by the scale the real "
        "update is about scale-times smaller than intended: training barely moves."
    )
    example = (
        "scaler.scale(loss).backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\n"
        "scaler.update()\n"
    )
    use_instead = (
        "scaler.scale(loss).backward()\n"
        "scaler.unscale_(optimizer)\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\n"
        "scaler.update()\n"
    )
    fix_safety = (
        "Safe: `scaler.unscale_(optimizer)` is inserted just before the clip; `scaler.step` "
        "knows the gradients are already unscaled and does not unscale them twice."
    )
    snippet_id = "amp-clip"
    valid: ClassVar[list[str]] = [
        """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
""",
        """
import torch
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
""",
        """
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
""",
            8,
        ),
        Invalid(
            """
import torch
from torch.cuda.amp import GradScaler
class Trainer:
    def __init__(self, model, opt, use_amp):
        self.model, self.opt = model, opt
        self.scaler = GradScaler(enabled=use_amp)

    def clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=1.0)

    def train_step(self, batch):
        loss = self.model(batch)
        self.scaler.scale(loss).backward()
        self.clip()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad()
""",
            15,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            for clip in clipping(unit):
                if clip.framework in {"accelerator", "fabric", "lightning"}:
                    continue
                if unit.partial:
                    finding = self._helper(model, unit, clip)
                    if finding is not None:
                        yield finding
                    continue
                backward = previous(unit, clip, {"backward"})
                if backward is None or not backward.scaler:
                    continue
                step = following(unit, clip, {"step", "scaler_step"})
                if step is None or between(unit, backward, clip, {"step", "scaler_step"}):
                    continue
                if between(unit, backward, clip, {"unscale"}):
                    continue
                if any(
                    u.order < backward.order and not u.inside(unit.micro)
                    for u in unit.of_kind("unscale")
                ):
                    continue
                optimizer = optimizer_of(step) or "optimizer"
                clip_at = placement(clip, step)
                backward_at = placement(backward, clip)
                step_at = placement(step, clip)
                yield RawFinding(
                    node=clip_at.node,
                    message=self.message,
                    evidence={
                        "clip": label(clip_at.node),
                        "clip_line": clip_at.node,
                        "scaler": backward.scaler,
                        "optimizer": optimizer,
                        "backward_line": backward_at.node,
                        "step_line": step_at.node,
                    },
                    patch=self._patch(model, clip_at.stmt, step, backward.scaler, optimizer),
                    fix_description=(
                        f"Insert `{backward.scaler}.unscale_({optimizer})` before the clip."
                    ),
                )

    def _helper(self, model: FileModel, unit: Unit, clip: Event) -> RawFinding | None:
        """A function that clips and then calls ``scaler.step()`` with the backward elsewhere:
        ``scaler.step`` expects scaled gradients, so the clip sees them scaled."""
        step = following(unit, clip, {"scaler_step", "step"})
        if step is None or step.kind != "scaler_step" or not step.scaler:
            step = next(
                (
                    s
                    for s in unit.of_kind("scaler_step")
                    if s.order > clip.order and not between(unit, clip, s, {"step"})
                ),
                None,
            )
        if step is None or step.kind != "scaler_step" or not step.scaler:
            return None
        if any(u.order < step.order for u in unit.of_kind("unscale")):
            return None
        optimizer = optimizer_of(step) or "optimizer"
        clip_at = placement(clip, step)
        step_at = placement(step, clip)
        return RawFinding(
            node=clip_at.node,
            message=HELPER_MESSAGE,
            evidence={
                "clip": label(clip_at.node),
                "clip_line": clip_at.node,
                "scaler": step.scaler,
                "optimizer": optimizer,
                "step_line": step_at.node,
            },
            patch=self._patch(model, clip_at.stmt, step, step.scaler, optimizer),
            fix_description=f"Insert `{step.scaler}.unscale_({optimizer})` before the clip.",
        )

    def _patch(
        self, model: FileModel, clip_stmt: cst.CSTNode, step: Event, scaler: str, optimizer: str
    ) -> Patch | None:
        if not movable(clip_stmt) or not model.owns(step.anchor_stmt):
            return None
        guard = path_guard(model, step.anchor_stmt, clip_stmt)
        if guard is None:
            return None
        code = guarded_code(f"{scaler}.unscale_({optimizer})", guard)
        return Patch().insert_before(clip_stmt, code)


HELPER_MESSAGE = (
    "`{clip}` on line {clip_line} clips gradients that are still scaled: `{scaler}.step` on "
    "line {step_line} expects gradients scaled by the loss scale, and nothing calls "
    "`{scaler}.unscale_({optimizer})` before the clip"
)
