"""amp-step-bypasses-scaler: ``optimizer.step()`` called directly while a GradScaler scales."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel, on_exclusive_paths
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import label, placements


class AmpStepBypassesScaler(Rule):
    id = "amp-step-bypasses-scaler"
    severity = "critical"
    message = (
        "`{step}` on line {step_line} applies gradients scaled by `{scaler}` (backward on line "
        "{backward_line}); call `{scaler}.step({optimizer})` instead"
    )
    what = "Finds `optimizer.step()` called directly after `scaler.scale(loss).backward()`."
    why = (
        "The gradients are still multiplied by the loss scale (65,536 at the start), so a direct "
        "`optimizer.step()` applies updates thousands of times too large, and steps with "
        "inf/NaN gradients are not skipped: the parameters blow up within a few steps."
    )
    example = "scaler.scale(loss).backward()\noptimizer.step()\n"
    use_instead = "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()\n"
    fix_safety = (
        "Safe: `optimizer.step()` becomes `scaler.step(optimizer)`, which unscales, skips "
        "non-finite steps and then calls `optimizer.step()`; `scaler.update()` is added after it "
        "when missing."
    )
    snippet_id = "amp-clip"
    valid: ClassVar[list[str]] = [
        # The auxiliary optimizer steps only on the full-precision side of `if use_amp:`,
        # where no gradient is scaled.
        """
import torch
scaler = torch.amp.GradScaler("cuda")
def train(model, head, loader, main_opt, aux_opt, use_amp):
    for x, y in loader:
        loss = model(x, y)
        if use_amp:
            scaler.scale(loss).backward()
            scaler.step(main_opt)
            scaler.update()
        else:
            (loss + head(x).pow(2).mean()).backward()
            main_opt.step()
            aux_opt.step()
        main_opt.zero_grad()
        aux_opt.zero_grad()
""",
        """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
""",
        """
import torch
scaler = torch.amp.GradScaler("cuda", enabled=False)
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
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
    scaler.scale(loss_fn(model(x), y)).backward()
    optimizer.step()
    optimizer.zero_grad()
""",
            6,
        ),
        Invalid(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
def train(model, loader, opt):
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        scaler.update()
        opt.zero_grad()
""",
            11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            scaled = [b for b in unit.backwards if b.scaler]
            if not scaled:
                continue
            stepped = {s.optimizer for s in unit.of_kind("scaler_step")}
            has_update = bool(unit.of_kind("scaler_update"))
            for step in unit.of_kind("step"):
                if step.framework is not None or step.optimizer in stepped:
                    continue
                # A scaled backward that can run before this step on one path (the plain
                # step of `if amp: ... else: ...`'s other side never sees scaled gradients).
                backward = next(
                    (b for b in scaled if b.order < step.order and not on_exclusive_paths(b, step)),
                    None,
                )
                if backward is None or not isinstance(step.call, cst.Call):
                    continue
                scaler = backward.scaler
                optimizer = step.optimizer or "optimizer"
                patch = Patch().replace_node(
                    step.call, cst.parse_expression(f"{scaler}.step({optimizer})")
                )
                if not has_update:
                    patch.insert_after(step.stmt, f"{scaler}.update()")
                step_at, backward_at = placements(step, backward)
                yield RawFinding(
                    node=step_at.node,
                    message=self.message,
                    evidence={
                        "step": label(step_at.node),
                        "step_line": step_at.node,
                        "scaler": scaler,
                        "optimizer": optimizer,
                        "backward_line": backward_at.node,
                    },
                    patch=patch,
                    fix_description=f"Replace the direct step with `{scaler}.step({optimizer})`.",
                )
