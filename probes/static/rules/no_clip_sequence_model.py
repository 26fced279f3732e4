"""no-clip-sequence-model: Transformer / RNN / policy-gradient training with no clipping."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import Event, FileModel, Unit
from gradient_doctor.probes.static.names import code_of, method_name
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    first_arg_of_constructor,
    label,
    missing_unscale,
    optimizer_of,
    shorten,
    torch_name,
)


class NoClipSequenceModel(Rule):
    id = "no-clip-sequence-model"
    severity = "warning"
    message = (
        "this file trains {what} (`{model_call}` on line {model_line}) but never clips "
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
        "Unsafe: the patch keeps the loop's structure and runs, but max_norm=1.0 is only the usual "
        "starting point. It changes every update whose gradient norm is above 1.0, and a model "
        "whose healthy norms sit well above that (policy gradients often do) is then slowed on "
        "every step. Measure the norms first (`gradient-doctor probe`) and set max_norm a little "
        "above their typical value; `check --verify` shows what the clip does to the run."
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
        if model.lightning_clipping or model.hf_trainer:
            return
        if model.clipping_hints:
            return  # clipping exists in a form the analyser does not follow
        if any(e.kind == "clip" and not e.measures_only for e in model.direct_events()):
            return
        seen = _what_it_trains(model)
        if seen is None:
            return
        what, node = seen
        for unit in model.units:
            if unit.framework in {"deepspeed", "accelerator"}:
                continue
            steps = [s for s in unit.steps if s.framework is None]
            if not steps or not unit.backwards:
                continue
            if any(e.kind == "clip" and not e.measures_only for e in unit.events):
                continue  # it clips in a helper (perhaps at the wrong place: other rules say)
            step = steps[0]
            yield RawFinding(
                node=step.call,
                message=self.message,
                evidence={
                    "what": what,
                    "model_call": shorten(
                        code_of(node.func if isinstance(node, cst.Call) else node)
                    ),
                    "model_line": node,
                    "step": label(step.call),
                    "step_line": step.call,
                },
                patch=self._patch(model, unit, step),
                fix_description="Clip the gradient norm to 1.0 just before the optimizer step.",
                # A threshold picked without the run's norms: structurally sound, not safe.
                fix_safe=False,
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


RECURRENT = frozenset({"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"})
ATTENTION = frozenset(
    {
        "Transformer",
        "TransformerEncoder",
        "TransformerDecoder",
        "TransformerEncoderLayer",
        "TransformerDecoderLayer",
        "MultiheadAttention",
    }
)
TRANSFORMER_CLASS = re.compile(r"Transformer|GPT|SelfAttention|CausalAttention|Llama|BERT", re.I)
LOG_PROB = re.compile(r"log_?probs?|logp", re.I)
ADVANTAGE = re.compile(r"advantage|\badv\b|returns?\b|reward|\brtg\b|ratio", re.I)


def _what_it_trains(model: FileModel) -> tuple[str, cst.CSTNode] | None:
    """(what the file trains, where it shows) for the models this rule is about: recurrent
    networks, Transformers (built-in or written as a class of the file), and score-function
    policy gradients (``log_prob`` times an advantage, with no ``rsample``: a SAC critic or a
    reparameterised actor is not one)."""
    policy: cst.Call | None = None
    for call in model.sequence_models:
        qual = model.qualify(call.func) or ""
        last = qual.rsplit(".", 1)[-1]
        if last in RECURRENT:
            return "a recurrent network", call
        if last in ATTENTION or last.startswith("AutoModelFor"):
            return "a Transformer", call
        if method_name(call) == "log_prob" and policy is None:
            policy = call
    for name, node in model.class_nodes.items():
        if TRANSFORMER_CLASS.search(name) and _is_module(model, name):
            return "a Transformer written as a class", node.name
    if policy is not None and _score_function(model):
        return "a score-function policy gradient (log-probabilities times returns)", policy
    return None


def _is_module(model: FileModel, class_name: str) -> bool:
    return any(
        base.rsplit(".", 1)[-1] == "Module" for base in model.class_bases.get(class_name, [])
    )


def _score_function(model: FileModel) -> bool:
    """REINFORCE / actor-critic / PPO: log-probabilities weighted by returns or advantages
    (or in a ratio), and no reparameterised sample (SAC actors and critics train through
    ``rsample``)."""
    if any(method_name(call) == "rsample" for call, _, _ in model.all_calls):
        return False
    statements = {id(stmt): stmt for _, stmt, _ in model.all_calls}
    statements.update({id(stmt): stmt for _, stmt, _ in model.divisions})
    for stmt in statements.values():
        if isinstance(stmt, cst.SimpleStatementLine):
            text = code_of(stmt)
            if LOG_PROB.search(text) and ADVANTAGE.search(text):
                return True
    return False
