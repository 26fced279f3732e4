"""clip-after-step: clipping called after the optimizer step (the update is unclipped)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import (
    STEP_KINDS,
    Event,
    FileModel,
    Unit,
    exclusive,
    stepped_optimizer,
)
from gradient_doctor.probes.static.names import call_arg, code_of
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    between,
    clipping,
    first_arg_of_constructor,
    following,
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
        # A helper trains the critic over its own loop; the actor's clip that follows belongs
        # to the actor's own backward and step.
        """
import torch
def fit_critic(critic, critic_opt, batches):
    for batch in batches:
        critic_opt.zero_grad()
        critic(batch).mean().backward()
        critic_opt.step()

def main(actor, critic, actor_opt, critic_opt, batches, rounds):
    for _ in range(rounds):
        fit_critic(critic, critic_opt, batches)
        actor_opt.zero_grad()
        (-critic(actor(batches[0]))).mean().backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
        actor_opt.step()
""",
        # The generator is clipped after the discriminator's step, for its own step.
        """
import torch
opt_d = torch.optim.Adam(D.parameters())
opt_g = torch.optim.Adam(G.parameters())
for real in loader:
    fake = G(torch.randn(16, 128))
    opt_d.zero_grad()
    opt_g.zero_grad()
    (D(fake.detach()).mean() - D(real).mean()).backward()
    (-D(fake).mean()).backward()
    opt_d.step()
    torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)
    opt_g.step()
""",
        # One helper unscales, clips and steps whichever optimizer it is given: two calls
        # with two optimizers unscale each once.
        """
import torch

class Trainer:
    def __init__(self, enc, dec):
        self.enc = enc
        self.dec = dec
        self.enc_opt = torch.optim.Adam(enc.parameters())
        self.dec_opt = torch.optim.Adam(dec.parameters())
        self.scaler = torch.amp.GradScaler("cuda")

    def _step(self, optimizer, params):
        self.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        self.scaler.step(optimizer)

    def fit(self, loader):
        for batch in loader:
            with torch.autocast("cuda"):
                loss = self.dec(self.enc(batch)).mean()
            self.enc_opt.zero_grad()
            self.dec_opt.zero_grad()
            self.scaler.scale(loss).backward()
            self._step(self.dec_opt, self.dec.parameters())
            self._step(self.enc_opt, self.enc.parameters())
            self.scaler.update()
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
        # The training loop runs in a helper; the caller clips once it returns (learned from
        # static6 Bert-VITS2, clipping after each epoch's `train_and_evaluate(...)`).
        Invalid(
            """
import torch
def run_epoch(net, opt, loader):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()

def main(net, opt, loader, sched, epochs):
    for epoch in range(epochs):
        run_epoch(net, opt, loader)
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=5.0)
        sched.step()
""",
            12,
        ),
        # One optimizer per sub-network, updated in an inner loop; the clip after that loop
        # comes too late for all of them (learned from leads4 HPPNet).
        Invalid(
            """
import torch
from torch.nn.utils import clip_grad_norm_
optimizers = {part: torch.optim.Adam(net.heads[part].parameters()) for part in HEADS}
for batch in loader:
    losses = net.head_losses(batch)
    for part in HEADS:
        optimizers[part].zero_grad()
        losses[part].backward()
        optimizers[part].step()
        schedulers[part].step()
    if clip_norm:
        clip_grad_norm_(net.parameters(), clip_norm)
    log(losses)
""",
            13,
        ),
        # The clipped parameters are those of the optimizer that already stepped.
        Invalid(
            """
import torch
opt_d = torch.optim.Adam(D.parameters())
opt_g = torch.optim.Adam(G.parameters())
for real in loader:
    fake = G(torch.randn(16, 128))
    opt_d.zero_grad()
    opt_g.zero_grad()
    (D(fake.detach()).mean() - D(real).mean()).backward()
    (-D(fake).mean()).backward()
    opt_g.step()
    torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)
    opt_d.step()
""",
            12,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        reported: set[int] = set()
        for finding in self._in_units(model):
            reported.add(id(finding.node))
            yield finding
        for clip, step in _after_an_inner_loop(model):
            if id(clip.call) in reported:
                continue
            reported.add(id(clip.call))
            yield RawFinding(
                node=clip.call,
                message=LOOP_MESSAGE,
                evidence={
                    "clip": label(clip.call),
                    "clip_line": clip.call,
                    "step": label(step.call),
                    "step_line": step.call,
                },
                fix_description=(
                    "Clip inside the loop that steps, between the backward and the step."
                ),
            )
        for clip, step in _after_a_stepping_call(model):
            if id(clip.call) in reported:
                continue
            reported.add(id(clip.call))
            yield RawFinding(
                node=clip.call,
                message=CALL_MESSAGE,
                evidence={
                    "clip": label(clip.call),
                    "clip_line": clip.call,
                    "step": label(step.call),
                    "call": label(step.chain[0].call),
                    "call_line": step.chain[0].call,
                },
                fix_description=(
                    "Clip inside the training loop, between the backward and the step."
                ),
            )

    def _in_units(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            for clip in clipping(unit):
                step = previous(unit, clip, {"step", "scaler_step"})
                if step is None:
                    continue
                if between(unit, step, clip, {"backward"}):
                    continue
                if previous(unit, step, {"backward"}) is None:
                    continue  # a rotated loop: this step uses the previous backward
                if _before_another_optimizer(model, unit, clip, step):
                    continue
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


def _before_another_optimizer(model: FileModel, unit: Unit, clip: Event, step: Event) -> bool:
    """``clip`` follows ``step`` but precedes (with no backward between) the step of another
    optimizer: with several optimizers (a discriminator stepped, then the generator clipped
    and stepped) it clips for that later step. It stays a finding only when the clipped
    parameters are visibly those of the optimizer that already stepped."""
    later = following(unit, clip, STEP_KINDS)
    if later is None or between(unit, clip, later, {"backward"}):
        return False
    earlier_optimizer = stepped_optimizer(step)
    if earlier_optimizer is None or stepped_optimizer(later) in {None, earlier_optimizer}:
        return False
    clipped = call_arg(clip.call, 0, "parameters") if isinstance(clip.call, cst.Call) else None
    stepped_params = first_arg_of_constructor(model, earlier_optimizer)
    return not (
        clipped is not None and stepped_params is not None and code_of(clipped) == stepped_params
    )


CALL_MESSAGE = (
    "`{clip}` on line {clip_line} clips after `{call}` (line {call_line}) has run its training "
    "loop: the optimizer already stepped (`{step}`), so the clipping changes gradients no step "
    "uses"
)


LOOP_MESSAGE = (
    "`{clip}` on line {clip_line} runs after the loop that steps with `{step}` (line "
    "{step_line}) has finished: every step of that loop already used unclipped gradients, so "
    "the clipping changes gradients no step uses"
)


def _after_an_inner_loop(model: FileModel) -> Iterator[tuple[Event, Event]]:
    """Clipping written in a training loop after an inner loop that runs backward and step on
    each of its passes (one optimizer per sub-network, ``for name in parts: ...
    optimizers[name].step()``), with no backward between and no step after it: the inner loop
    has consumed its gradients, so the clip changes nothing a step uses (learned from leads4
    HPPNet, a clip after the per-sub-network update loop)."""
    for func in [model.module_info, *model.functions]:
        events = model.expanded(func)
        for index, clip in enumerate(events):
            if clip.kind != "clip" or clip.chain or clip.measures_only:
                continue
            earlier = events[:index]
            step = next((e for e in reversed(earlier) if e.kind in STEP_KINDS), None)
            if step is None or step.chain or exclusive(step, clip):
                continue
            clip_frames = {id(frame.node) for frame in clip.frames}
            inner = [
                frame
                for frame in step.frames
                if frame.kind == "loop" and id(frame.node) not in clip_frames
            ]
            if not inner:
                continue  # the step and the clip share their loop: the unit rule's case
            if not any(frame.kind == "loop" for frame in clip.frames):
                continue  # a clip once training is over trains nothing either way
            if not any(
                e.kind == "backward" and e.order < step.order and not exclusive(e, step)
                for e in earlier
            ):
                continue
            if any(e.kind == "backward" and e.order > step.order for e in earlier):
                continue
            if any(e.kind in STEP_KINDS for e in events[index + 1 :]):
                continue  # a later step (another optimizer's, a helper's) may use the clip
            yield clip, step


def _after_a_stepping_call(model: FileModel) -> Iterator[tuple[Event, Event]]:
    """Clipping written after the call of a helper that runs a whole training loop (backward
    and step inside its own loop), with no backward between: ``train_one_epoch(...)`` then
    ``clip_grad_norm_(...)`` in the epoch loop (learned from static6 Bert-VITS2). A step that
    follows the clip in the caller (a second optimizer clipped before its own step) keeps it
    silent."""
    for func in [model.module_info, *model.functions]:
        events = model.expanded(func)
        for index, clip in enumerate(events):
            if clip.kind != "clip" or clip.chain or clip.measures_only:
                continue
            earlier = events[:index]
            step = next((e for e in reversed(earlier) if e.kind in STEP_KINDS), None)
            if step is None or not step.chain or exclusive(step, clip):
                continue
            helper = step.chain[0]
            own_loops = [f for f in step.frames[len(helper.frames) :] if f.kind == "loop"]
            if not own_loops:
                continue  # the helper steps once: the caller's own loop is the training loop
            if any(e.kind == "backward" and e.order > step.order for e in earlier):
                continue
            if not any(e.kind == "backward" and e.chain[:1] == (helper,) for e in earlier):
                continue
            later = events[index + 1 :]
            if any(e.kind in STEP_KINDS and not e.chain for e in later):
                continue
            yield clip, step
