"""clip-before-backward: clipping runs before ``backward()`` fills the gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.frameworks import automatic_optimization, lightning_modules
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    between,
    clipping,
    following,
    guarded_statement,
    label,
    placement,
    placements,
    previous,
)


class ClipBeforeBackward(Rule):
    id = "clip-before-backward"
    severity = "critical"
    message = "`{clip}` on line {clip_line} runs before `{backward}` on line {backward_line}"
    what = "Finds gradient clipping placed before the backward pass of the same iteration."
    why = (
        "Before `backward()` the gradients are empty (or zero, or still the previous "
        "iteration's). Clipping them does nothing to the gradients the step will use, so "
        "training runs unclipped."
    )
    example = (
        "optimizer.zero_grad()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "loss.backward()\n"
        "optimizer.step()\n"
    )
    use_instead = (
        "optimizer.zero_grad()\n"
        "loss.backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "optimizer.step()\n"
    )
    fix_safety = "Safe: the clipping call is moved, unchanged, to just before the optimizer step."
    snippet_id = "training-loop-order"
    valid: ClassVar[list[str]] = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        """
import torch
import lightning as L
class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
""",
        # Lightning's automatic optimization calls backward after `training_step` returns:
        # there is no backward in the file to order against, so nothing is reported.
        """
import lightning as L
import torch
class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        return self.compute_loss(batch)

    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
""",
        # Manual optimisation: the hand-written clipper runs after `manual_backward`.
        """
import lightning as L
def ratio_clip_gradients_(net, ref):
    for p in net.parameters():
        if p.grad is not None:
            p.grad.mul_(0.5)
class Estimator(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.objective(batch))
        ratio_clip_gradients_(self.head, self.body)
        opt.step()
""",
        # A call that only reads the clipping setting is no clip.
        """
import lightning as L
class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        self.log("clip_limit", get_grad_clip_value(self.hparams))
        return self.compute_loss(batch)
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    loss.backward()
    optimizer.step()
""",
            6,
        ),
        Invalid(
            """
from torch.nn.utils import clip_grad_norm_
def train(model, loader, opt):
    for batch in loader:
        opt.zero_grad()
        clip_grad_norm_(model.parameters(), max_norm=5.0)
        out = model(batch)
        out.loss.backward()
        opt.step()
""",
            6,
        ),
        Invalid(
            """
import lightning as L
import torch
class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self.compute_loss(batch)
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        return loss
""",
            7,
        ),
        # A hand-written clipper (it rescales `.grad` itself) inside automatic optimisation's
        # `training_step`: Lightning calls backward only after the step returns.
        Invalid(
            """
import lightning as L
def ratio_clip_gradients_(net, ref):
    for p in net.parameters():
        if p.grad is not None:
            p.grad.mul_(0.5)
class Estimator(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self.objective(batch)
        ratio_clip_gradients_(self.head, self.body)
        return loss
""",
            10,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            for clip in clipping(unit):
                if previous(unit, clip, {"backward"}) is not None:
                    continue
                backward = following(unit, clip, {"backward"})
                if backward is None or between(unit, clip, backward, {"step", "scaler_step"}):
                    continue
                step = following(unit, backward, {"step", "scaler_step"})
                if step is None:
                    continue
                clip_at, backward_at = placements(clip, backward)
                step_at = placement(step, clip)
                patch = None
                moving = guarded_statement(model, clip_at.stmt)
                if moving is not None and clip_at.stmt is not step_at.stmt:
                    patch = Patch().move_before(moving, step_at.stmt)
                yield RawFinding(
                    node=clip_at.node,
                    message=self.message,
                    evidence={
                        "clip": label(clip_at.node),
                        "clip_line": clip_at.node,
                        "backward": label(backward_at.node),
                        "backward_line": backward_at.node,
                        "step_line": step_at.node,
                    },
                    patch=patch,
                    fix_description="Move the clipping call after backward, before the step.",
                )
        yield from _lightning_training_step(model)


LIGHTNING_MESSAGE = (
    "`{clip}` on line {clip_line} clips inside `training_step` of `{module}`, which Lightning "
    "runs before it calls backward on the returned loss: the clip sees the previous step's "
    "(already zeroed) gradients and the new ones are never clipped; clip in "
    "`configure_gradient_clipping` / `on_before_optimizer_step`, or set `gradient_clip_val`"
)


def _lightning_training_step(model: FileModel) -> Iterator[RawFinding]:
    """Automatic optimisation runs ``training_step`` (the forward) before backward: Lightning
    2.6.6 ``loops/optimization/automatic.py`` 130-140 (step, then zero_grad, then backward)."""
    for class_name in lightning_modules(model):
        if not automatic_optimization(model, class_name):
            continue
        func = model.methods.get((class_name, "training_step"))
        if func is None:
            continue
        for event in model.expanded(func):
            if event.kind != "clip" or event.measures_only or event.framework == "lightning":
                continue
            node = event.anchor
            yield RawFinding(
                node=node,
                message=LIGHTNING_MESSAGE,
                evidence={"clip": label(node), "clip_line": node, "module": class_name},
            )
