"""no-clip-sequence-model: Transformer / RNN / policy-gradient training with no clipping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import Event, FileModel, Unit
from gradient_doctor.probes.static.names import code_of
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    first_arg_of_constructor,
    label,
    missing_unscale,
    optimizer_of,
    torch_name,
)


class NoClipSequenceModel(Rule):
    id = "no-clip-sequence-model"
    severity = "warning"
    message = (
        "this file trains a sequence model (`{model_call}` on line {model_line}) but never clips "
        "gradients before the optimizer step `{step}` on line {step_line}"
    )
    what = "Finds Transformer, RNN/LSTM/GRU or policy-gradient training loops with no clipping."
    why = (
        "These models are prone to occasional gradient spikes (long sequences, attention, "
        "high-variance returns). One spike can undo hours of training or turn the loss into "
        "NaN. Norm clipping at about 1.0 (Transformers) or 0.25-5 (RNNs) is the standard guard "
        "and costs almost nothing."
    )
    example = "model = nn.LSTM(128, 256, num_layers=2)\nloss.backward()\noptimizer.step()\n"
    use_instead = (
        "model = nn.LSTM(128, 256, num_layers=2)\n"
        "loss.backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "optimizer.step()\n"
    )
    fix_safety = (
        "Mostly safe: max_norm=1.0 is the usual starting point; it changes the updates only on "
        "steps whose gradient norm is above 1.0. Tune it from measured norms."
    )
    snippet_id = "clip-norm"
    valid: ClassVar[list[str]] = [
        """
import torch
import torch.nn as nn
model = nn.LSTM(128, 256)
optimizer = torch.optim.Adam(model.parameters())
for x, y in loader:
    loss_fn(model(x)[0], y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()
""",
        """
import torch
import torch.nn as nn
model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
""",
        """
import lightning as L
import torch.nn as nn
class LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(32, 32)
trainer = L.Trainer(gradient_clip_val=1.0)
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
import torch.nn as nn
model = nn.LSTM(128, 256)
optimizer = torch.optim.Adam(model.parameters())
for x, y in loader:
    loss_fn(model(x)[0], y).backward()
    optimizer.step()
    optimizer.zero_grad()
""",
            8,
        ),
        Invalid(
            """
import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4), num_layers=6)

net = Net()
opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
scaler = torch.amp.GradScaler("cuda")
for batch in loader:
    scaler.scale(net(batch)).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
""",
            14,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        if not model.sequence_models or model.lightning_clipping or model.hf_trainer:
            return
        if model.clipping_hints:
            return  # clipping exists in a form the analyser does not follow
        if any(e.kind == "clip" and not e.measures_only for e in model.direct_events()):
            return
        seq = model.sequence_models[0]
        for unit in model.units:
            if unit.framework in {"deepspeed", "accelerator"}:
                continue
            steps = [s for s in unit.steps if s.framework is None]
            if not steps or not unit.backwards:
                continue
            step = steps[0]
            yield RawFinding(
                node=step.call,
                message=self.message,
                evidence={
                    "model_call": code_of(seq.func),
                    "model_line": seq,
                    "step": label(step.call),
                    "step_line": step.call,
                },
                patch=self._patch(model, unit, step),
                fix_description="Clip the gradient norm to 1.0 just before the optimizer step.",
            )

    def _patch(self, model: FileModel, unit: Unit, step: Event) -> Patch | None:
        torch = torch_name(model)
        optimizer = optimizer_of(step)
        params = first_arg_of_constructor(model, optimizer)
        if torch is None or params is None:
            return None
        patch = Patch()
        unscale = missing_unscale(unit, step)
        if unscale is not None:
            patch.insert_before(step.stmt, unscale)
        patch.insert_before(step.stmt, f"{torch}.nn.utils.clip_grad_norm_({params}, max_norm=1.0)")
        return patch
