"""clip-after-step: clipping called after the optimizer step (the update is unclipped)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    between,
    clipping,
    guarded_statement,
    label,
    missing_unscale,
    placements,
    previous,
)


class ClipAfterStep(Rule):
    id = "clip-after-step"
    severity = "critical"
    message = "`{clip}` on line {clip_line} runs after `{step}` on line {step_line}"
    what = "Finds gradient clipping that runs after the optimizer step of the same iteration."
    why = (
        "The optimizer step consumes the gradients. Clipping afterwards changes gradients that "
        "are about to be zeroed, so the update that just happened was never clipped and the "
        "clipping has no effect at all."
    )
    example = (
        "loss.backward()\n"
        "optimizer.step()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
    )
    use_instead = (
        "loss.backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "optimizer.step()\n"
    )
    fix_safety = (
        "Safe: the clipping call is moved, unchanged, to just before the step (after "
        "`scaler.unscale_` when a GradScaler is used, which the fix inserts if missing)."
    )
    snippet_id = "training-loop-order"
    valid: ClassVar[list[str]] = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        """
import torch
from torch.nn.utils import clip_grad_norm_ as clip
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(criterion(model(x), y)).backward()
    scaler.unscale_(opt)
    clip(model.parameters(), max_norm=1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
""",
        """
import torch
class Trainer:
    def _clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def fit(self, loader):
        for batch in loader:
            self.model(batch).loss.backward()
            self._clip()
            self.optimizer.step()
            self.optimizer.zero_grad()
""",
        # An infinite max_norm only measures the norm; reading it after the step is harmless.
        """
import math
import torch
for x, y in loader:
    criterion(model(x), y).backward()
    optimizer.step()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
    optimizer.zero_grad()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""",
            8,
        ),
        Invalid(
            """
import torch
import torch.nn as nn
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    scaler.scale(criterion(model(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    opt.zero_grad()
""",
            9,
        ),
        Invalid(
            """
import torch
class Trainer:
    def _clip_gradients(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def fit(self, loader):
        for batch in loader:
            self.model(batch).loss.backward()
            self.optimizer.step()
            self._clip_gradients()
            self.optimizer.zero_grad()
""",
            11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            for clip in clipping(unit):
                step = previous(unit, clip, {"step", "scaler_step"})
                if step is None:
                    continue
                if between(unit, step, clip, {"backward"}):
                    continue
                if previous(unit, step, {"backward"}) is None:
                    continue  # a rotated loop: this step uses the previous backward
                clip_at, step_at = placements(clip, step)
                patch = None
                # A helper call that clips may move too: it moves as a whole, before the step.
                moving = guarded_statement(model, clip_at.stmt)
                if moving is not None and clip_at.stmt is not step_at.stmt:
                    patch = Patch()
                    # A framework's clipping call unscales the gradients itself.
                    unscale = missing_unscale(unit, step) if clip.framework is None else None
                    if unscale is not None:
                        patch.insert_before(step_at.stmt, unscale)
                    patch.move_before(moving, step_at.stmt)
                yield RawFinding(
                    node=clip_at.node,
                    message=self.message,
                    evidence={
                        "clip": label(clip_at.node),
                        "clip_line": clip_at.node,
                        "step": label(step_at.node),
                        "step_line": step_at.node,
                    },
                    patch=patch,
                    fix_description="Move the clipping call to just before the optimizer step.",
                )
