"""amp-double-unscale: ``scaler.unscale_`` called twice before one ``scaler.update()``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.frameworks import accelerate_runs_deepspeed
from gradient_doctor.probes.static.model import (
    Event,
    FileModel,
    Unit,
    checks_unscaled_state,
    exclusive,
)
from gradient_doctor.probes.static.names import call_arg
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    accumulating_units,
    between,
    clipping,
    label,
    placements,
    previous,
)


class AmpDoubleUnscale(Rule):
    id = "amp-double-unscale"
    severity = "warning"
    message = (
        "`{second}` on line {second_line} unscales `{optimizer}` again after line {first_line}, "
        "before `update()`: PyTorch raises RuntimeError"
    )
    what = (
        "Finds a second `scaler.unscale_(optimizer)` for the same optimizer in one update, "
        "including Accelerate's clipping (which unscales itself) after an explicit unscale or "
        "on every micro-batch of an `accumulate()` window."
    )
    why = (
        "`unscale_` may run once per optimizer between two `scaler.update()` calls. A second call "
        "raises `RuntimeError: unscale_() has already been called on this optimizer since the "
        "last update()`. It usually appears after a refactor moves clipping into a helper that "
        "unscales on its own."
    )
    example = (
        "scaler.unscale_(optimizer)\n"
        "clip_gradients(model, scaler, optimizer)  # unscales again inside\n"
        "scaler.step(optimizer)\n"
    )
    use_instead = (
        "scaler.unscale_(optimizer)\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\n"
        "scaler.update()\n"
    )
    fix_safety = "Safe: the redundant `unscale_` statement is removed; one unscale remains."
    snippet_id = "amp-clip"
    valid: ClassVar[list[str]] = [
        # Accelerate clipping every micro-batch under bf16: no GradScaler, nothing unscales.
        """
from accelerate import Accelerator
acc = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=8)
net, opt, data = acc.prepare(net, opt, data)
for sample in data:
    with acc.accumulate(net):
        acc.backward(net(sample).loss)
        acc.clip_grad_norm_(net.parameters(), 2.0)
        opt.step()
        opt.zero_grad()
""",
        # The precision comes from the launch configuration, which the file does not show:
        # silent (the every-micro-batch clip is accum-clip-every-microstep's finding).
        """
from accelerate import Accelerator
acc = Accelerator(gradient_accumulation_steps=8)
net, opt, data = acc.prepare(net, opt, data)
for sample in data:
    with acc.accumulate(net):
        acc.backward(net(sample).loss)
        acc.clip_grad_norm_(net.parameters(), 2.0)
        opt.step()
        opt.zero_grad()
""",
        # Clipping only on the sync step: one unscale per scaler update.
        """
from accelerate import Accelerator
acc = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=8)
net, opt, data = acc.prepare(net, opt, data)
for sample in data:
    with acc.accumulate(net):
        acc.backward(net(sample).loss)
        if acc.sync_gradients:
            acc.clip_grad_norm_(net.parameters(), 2.0)
        opt.step()
        opt.zero_grad()
""",
        """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
""",
        """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(loss_g(x) + loss_d(y)).backward()
    scaler.unscale_(opt_g)
    scaler.unscale_(opt_d)
    scaler.step(opt_g)
    scaler.step(opt_d)
    scaler.update()
""",
        """
import torch
class Trainer:
    def update(self):
        self.accelerator.unscale_gradients(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def update_clipped_by_accelerate(self):
        self.accelerator.clip_grad_norm_(self.net.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
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
        # Accelerate's clip unscales on every micro-batch; the scaler updates only with the
        # step, so the second micro-batch unscales twice under fp16.
        Invalid(
            """
from accelerate import Accelerator
acc = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=8)
net, opt, data = acc.prepare(net, opt, data)
for sample in data:
    with acc.accumulate(net):
        acc.backward(net(sample).loss)
        acc.clip_grad_norm_(net.parameters(), 2.0)
        opt.step()
        opt.zero_grad()
""",
            8,
        ),
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
""",
            8,
        ),
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler("cuda")
def clip_gradients(model, optimizer):
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    scaler.unscale_(optimizer)
    clip_gradients(model, optimizer)
    scaler.step(optimizer)
    scaler.update()
""",
            11,
        ),
        # A trainer's update method: Accelerate's clip unscales again after an explicit
        # unscale (learned from static6 DALLE2's decoder trainer).
        Invalid(
            """
class Trainer:
    def __init__(self, accelerator, net, optimizer, max_norm):
        self.accelerator = accelerator
        self.net = net
        self.optimizer = optimizer
        self.max_norm = max_norm

    def update(self):
        if self.max_norm is not None:
            self.accelerator.unscale_gradients(self.optimizer)
            self.accelerator.clip_grad_norm_(self.net.parameters(), self.max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
""",
            12,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        yield from _accelerate_clip_every_micro_batch(model)
        for unit in model.units:
            yield from _framework_clip_after_unscale(unit)
            unscales = unit.of_kind("unscale")
            for index, second in enumerate(unscales):
                first = next(
                    (
                        u
                        for u in reversed(unscales[:index])
                        if u.identity(u.optimizer) == second.identity(second.optimizer)
                        and not exclusive(u, second)
                    ),
                    None,
                )
                if first is None or between(unit, first, second, {"scaler_update"}):
                    continue
                if first.inside(unit.micro) != second.inside(unit.micro):
                    continue
                if checks_unscaled_state(second):
                    continue
                second_at, first_at = placements(second, first)
                patch = None
                # The unscale_ that stays must run whenever the removed one did: otherwise a
                # clip after the removed one sees scaled gradients on the paths without it.
                if second_at.standalone and _runs_whenever(first, second):
                    patch = Patch(remove=[second_at.stmt])
                elif (
                    first_at.standalone
                    and _runs_whenever(second, first)
                    and not between(unit, first, second, {"clip"})
                ):
                    patch = Patch(remove=[first_at.stmt])
                yield RawFinding(
                    node=second_at.node,
                    message=self.message,
                    evidence={
                        "second": label(second_at.node),
                        "second_line": second_at.node,
                        "first_line": first_at.node,
                        "optimizer": second.optimizer or "optimizer",
                    },
                    patch=patch,
                    fix_description="Remove the redundant `unscale_` call.",
                )


FRAMEWORK_CLIP_MESSAGE = (
    "`{second}` on line {second_line} unscales the gradients itself (Accelerate's clipping "
    "calls `unscale_gradients()` first), but line {first_line} already unscaled them for this "
    "step: with fp16 mixed precision the second unscale raises `RuntimeError: unscale_() has "
    "already been called on this optimizer since the last update()`"
)

WINDOW_CLIP_MESSAGE = (
    "`{clip}` on line {clip_line} runs on every micro-batch of the `accumulate()` window, and "
    "Accelerate's clipping unscales the gradients on each call while the scaler updates only "
    "with the step (every `{divisor}`): with fp16 mixed precision the second micro-batch "
    "raises `RuntimeError: unscale_() has already been called on this optimizer since the "
    "last update()`; clip only under `if {accelerator}.sync_gradients:`"
)


def _accelerate_clip_every_micro_batch(model: FileModel) -> Iterator[RawFinding]:
    """``accelerator.clip_grad_norm_`` on every micro-batch of ``with
    accelerator.accumulate(model):`` (learned from forum1 accelerate-641, where the maintainer
    traced the user's RuntimeError to it). Accelerate 1.15.0 unscales in every clip call when
    fp16 runs (``accelerator.py`` 2946-2960, 3047) and steps and updates the scaler only on
    sync steps (``optimizer.py`` 112-113, 169), so the next micro-batch's clip unscales twice.
    Only where the file's ``Accelerator`` names fp16: without ``mixed_precision`` the launch
    configuration decides, which the analyser cannot see (and bf16 or fp32 never unscale).
    Silent when DeepSpeed runs it (its engine clips by config); no patch here
    (accum-clip-every-microstep moves the clip)."""
    if accelerate_runs_deepspeed(model) or not _accelerator_runs_fp16(model):
        return
    for unit, acc, _steps in accumulating_units(model):
        if acc.style != "accelerate":
            continue
        for clip in clipping(unit):
            if clip.framework != "accelerator" or not unit.in_micro_step(clip):
                continue
            if previous(unit, clip, {"backward"}) is None:
                continue
            node = clip.anchor
            yield RawFinding(
                node=node,
                message=WINDOW_CLIP_MESSAGE,
                evidence={
                    "clip": label(node),
                    "clip_line": node,
                    "divisor": acc.divisor_text,
                    "accelerator": clip.receiver or "accelerator",
                },
            )


def _accelerator_runs_fp16(model: FileModel) -> bool:
    """An ``Accelerator(mixed_precision="fp16")`` in the file."""
    for call in model.accelerators.values():
        value = call_arg(call, None, "mixed_precision")
        if isinstance(value, cst.SimpleString) and value.evaluated_value == "fp16":
            return True
    return False


UNSCALING_FRAMEWORKS = frozenset({"accelerator"})
"""Frameworks whose clipping call unscales the gradients itself (Accelerate's
``clip_grad_norm_`` / ``clip_grad_value_`` call ``unscale_gradients()`` first)."""


def _framework_clip_after_unscale(unit: Unit) -> Iterator[RawFinding]:
    """``accelerator.unscale_gradients(opt)`` (or ``scaler.unscale_``) and then
    ``accelerator.clip_grad_norm_(...)`` in the same update: the clip unscales a second time
    (learned from static6 DALLE2's decoder trainer)."""
    unscales = unit.of_kind("unscale")
    for clip in unit.of_kind("clip"):
        if clip.framework not in UNSCALING_FRAMEWORKS:
            continue
        first = next(
            (
                u
                for u in reversed(unscales)
                if u.order < clip.order
                and not exclusive(u, clip)
                and u.inside(unit.micro) == clip.inside(unit.micro)
                and not between(unit, u, clip, {"scaler_update", "step", "scaler_step"})
            ),
            None,
        )
        if first is None or checks_unscaled_state(first):
            continue
        clip_at, first_at = placements(clip, first)
        patch = None
        if (
            first_at.standalone
            and _runs_whenever(first, clip)
            and _runs_whenever(clip, first)
            and not between(unit, first, clip, {"clip", "norm_read"})
        ):
            patch = Patch(remove=[first_at.stmt])
        yield RawFinding(
            node=clip_at.node,
            message=FRAMEWORK_CLIP_MESSAGE,
            evidence={
                "second": label(clip_at.node),
                "second_line": clip_at.node,
                "first_line": first_at.node,
                "optimizer": first.optimizer or "optimizer",
            },
            patch=patch,
            fix_description="Remove the explicit unscale: the framework's clip unscales.",
        )


def _runs_whenever(kept: Event, removed: Event) -> bool:
    """Every loop, branch and context around ``kept`` also surrounds ``removed``: ``kept``
    runs on every path that reaches ``removed``."""
    around_removed = {(id(f.node), f.branch) for f in removed.frames}
    return all((id(f.node), f.branch) in around_removed for f in kept.frames)
