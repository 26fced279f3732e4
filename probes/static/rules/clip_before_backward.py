"""clip-before-backward: clipping runs before ``backward()`` fills the gradients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.frameworks import before_backward_clips
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
    what = (
        "Finds gradient clipping placed before the backward pass of the same iteration, "
        "including clipping in the hooks a framework runs before its backward: Lightning's "
        "`training_step` (automatic optimisation) and an `optimizer_step` override before it "
        "runs the closure, a Hugging Face `Trainer`'s `compute_loss`."
    )
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
        # Lightning's `optimizer_step` override that runs the closure (training_step and
        # backward) first, then clips.
        """
import lightning as L
import torch
class Flow(L.LightningModule):
    def training_step(self, batch, batch_idx):
        return -self.log_likelihood(batch).mean()

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer_closure()
        torch.nn.utils.clip_grad_norm_(self.parameters(), 10.0)
        optimizer.step()
""",
        # A Trainer subclass whose own `training_step` clips after its backward.
        """
import torch
from transformers import Trainer
class ClippedTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs)
        self.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        return loss.detach()
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
        # An `optimizer_step` override that clips before the call that runs the closure
        # (training_step, then backward).
        Invalid(
            """
import lightning as L
import torch
class Flow(L.LightningModule):
    def training_step(self, batch, batch_idx):
        return -self.log_likelihood(batch).mean()

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 10.0)
        optimizer.step(closure=optimizer_closure)
""",
            9,
        ),
        # A Trainer subclass that clips in `compute_loss`, which its training_step runs
        # before backward.
        Invalid(
            """
import torch
from transformers import Trainer
class ClippedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        out = model(**inputs)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        return (out.loss, out) if return_outputs else out.loss
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
        reported: set[int] = set()
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
                reported.add(id(clip_at.node))
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
        for finding in _framework_hooks(model):
            if id(finding.node) not in reported:
                yield finding


LIGHTNING_MESSAGE = (
    "`{clip}` on line {clip_line} clips inside `training_step` of `{module}`, which Lightning "
    "runs before it calls backward on the returned loss: the clip sees the previous step's "
    "(already zeroed) gradients and the new ones are never clipped; clip in "
    "`configure_gradient_clipping` / `on_before_optimizer_step`, or set `gradient_clip_val`"
)


HOOK_MESSAGE = (
    "`{clip}` on line {clip_line} clips in `{hook}` of `{module}`, which {framework} runs "
    "before backward: the clip sees the previous step's (already zeroed) gradients and the "
    "new ones are never clipped; {remedy}"
)
REMEDIES = {
    "optimizer_step": (
        "run the closure first (`optimizer_closure()`), then clip, then "
        "`optimizer.step()`, or clip in `configure_gradient_clipping`"
    ),
    "Lightning": (
        "clip in `configure_gradient_clipping` / `on_before_optimizer_step`, or set "
        "`gradient_clip_val`"
    ),
    "the Trainer": (
        "set `max_grad_norm` in the `TrainingArguments` (the Trainer clips after backward)"
    ),
}


def _framework_hooks(model: FileModel) -> Iterator[RawFinding]:
    """Clipping in the hooks a framework runs before backward (see
    :func:`frameworks.before_backward_clips`): Lightning's automatic optimisation (2.6.6
    ``loops/optimization/automatic.py`` 130-140: ``training_step``, then zero_grad, then
    backward) and the Hugging Face Trainer (``compute_loss`` inside ``training_step``)."""
    for framework, class_name, hook, event in before_backward_clips(model):
        node = event.anchor
        if framework == "Lightning" and hook == "training_step":
            yield RawFinding(
                node=node,
                message=LIGHTNING_MESSAGE,
                evidence={"clip": label(node), "clip_line": node, "module": class_name},
            )
            continue
        yield RawFinding(
            node=node,
            message=HOOK_MESSAGE,
            evidence={
                "clip": label(node),
                "clip_line": node,
                "module": class_name,
                "hook": hook,
                "framework": framework,
                "remedy": REMEDIES.get(hook) or REMEDIES[framework],
            },
        )
