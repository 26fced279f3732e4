"""no-clip-sequence-model: Transformer / RNN / policy-gradient training with no clipping."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import Event, FileModel, Unit
from gradient_doctor.probes.static.names import code_of, method_name, receiver
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import (
    first_arg_of_constructor,
    label,
    missing_unscale,
    optimizer_of,
    shorten,
    torch_name,
)
from gradient_doctor.probes.static.traverse import walk


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
        # A normalizing flow fitted by maximum likelihood: the base density's log-probability
        # of the data is maximised directly (and returned from a helper); sampling only draws
        # pictures. No action is sampled and weighed by a return (learned from static12).
        """
import torch
from torch import nn
class CouplingFlow(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.shift = nn.Sequential(nn.Linear(dim // 2, 64), nn.ReLU(), nn.Linear(64, dim // 2))
        self.prior = torch.distributions.Normal(torch.zeros(dim), torch.ones(dim))

    def log_density(self, x):
        lower, upper = x.chunk(2, dim=1)
        z = torch.cat([lower, upper - self.shift(lower)], dim=1)
        return self.prior.log_prob(z).sum(1)

flow = CouplingFlow(8)
optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
for step, x in enumerate(loader):
    nll = -flow.log_density(x).mean()
    optimizer.zero_grad()
    nll.backward()
    optimizer.step()
    if step % 500 == 0:
        draws = flow.prior.sample((16,))
        print(step, nll.item(), flow.prior.log_prob(draws).sum(1).mean().item())
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
        # PPO on stored rollouts: the ratio of the new to the old log-probabilities of the
        # buffer's actions, times the advantages.
        Invalid(
            """
import torch
policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
for obs, taken, old_logp, gains in rollout_batches:
    dist = torch.distributions.Categorical(logits=policy(obs))
    new_logp = dist.log_prob(taken_actions[taken])
    ratio = (new_logp - old_logp).exp()
    clipped = torch.clamp(ratio, 0.8, 1.2)
    loss = -torch.min(ratio * gains["advantages"], clipped * gains["advantages"]).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
            13,
        ),
        # REINFORCE whose sampled move is not called an action: it is the drawn sample whose
        # log-probability is weighed by the reward.
        Invalid(
            """
import torch
scorer = torch.nn.Linear(16, 5)
opt = torch.optim.SGD(scorer.parameters(), lr=0.01)
for state in states:
    dist = torch.distributions.Categorical(logits=scorer(state))
    move = dist.sample()
    reward = play(move)
    loss = -dist.log_prob(move) * reward
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
            12,
        ),
        # The return is bound by a zip over the episode: `G` reads `discounted`.
        Invalid(
            """
import torch
from torch.distributions import Categorical
net = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for episode in range(500):
    trace, discounted = run_episode(net, Categorical)
    terms = []
    for step_logp, G in zip(trace, discounted_returns(discounted)):
        terms.append(-step_logp * G)
    opt.zero_grad()
    torch.stack(terms).sum().backward()
    opt.step()

def run_episode(net, family):
    picked = []
    for obs in rollout():
        dist = family(logits=net(obs))
        action = dist.sample()
        picked.append(dist.log_prob(action))
    return picked, rewards_of(picked)
""",
            13,
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
                    "model_call": shorten(code_of(_shown(node))),
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
LOG_PROB = re.compile(r"log_?probs?|logp|(?:^|_)ratios?(?:_|$)", re.I)
"""An identifier holding log-probabilities (or the PPO probability ratio built from them)."""
ADVANTAGE = re.compile(r"advantage|(?:^|_)advs?(?:_|$)|returns?|reward|(?:^|_)rtgs?(?:_|$)", re.I)
"""An identifier holding what a policy gradient weighs log-probabilities by."""
ACTION = re.compile(r"action|(?:^|_)(?:acts?|a)(?:_|$)", re.I)
"""An identifier that names actions."""
NOT_SAMPLERS = re.compile(r"(?:^|\.)random$")
"""Receivers whose ``.sample(...)`` draws from a list, not from a distribution."""


def _what_it_trains(model: FileModel) -> tuple[str, cst.CSTNode] | None:
    """(what the file trains, where it shows) for the models this rule is about: recurrent
    networks, Transformers (built-in or written as a class of the file), and score-function
    policy gradients (the log-probability of sampled actions times a return or advantage,
    with no ``rsample``: a SAC critic or a reparameterised actor is not one)."""
    log_probs: list[cst.Call] = []
    for call in model.sequence_models:
        qual = model.qualify(call.func) or ""
        last = qual.rsplit(".", 1)[-1]
        if last in RECURRENT:
            return "a recurrent network", call
        if last in ATTENTION or last.startswith("AutoModelFor"):
            return "a Transformer", call
        if method_name(call) == "log_prob":
            log_probs.append(call)
    for name, node in model.class_nodes.items():
        if TRANSFORMER_CLASS.search(name) and _is_module(model, name):
            return "a Transformer written as a class", node.name
    if log_probs:
        product = _score_function(model, log_probs)
        if product is not None:
            return "a score-function policy gradient (log-probabilities times returns)", product
    return None


def _shown(node: cst.CSTNode) -> cst.CSTNode:
    """What the message quotes: a constructor's callee, a product without its parentheses."""
    if isinstance(node, cst.Call):
        return node.func
    if isinstance(node, cst.BinaryOperation):
        return node.with_changes(lpar=[], rpar=[])
    return node


def _is_module(model: FileModel, class_name: str) -> bool:
    return any(
        base.rsplit(".", 1)[-1] == "Module" for base in model.class_bases.get(class_name, [])
    )


def _score_function(model: FileModel, log_probs: list[cst.Call]) -> cst.BinaryOperation | None:
    """The product that makes the file a REINFORCE / actor-critic / PPO update: log-probabilities
    (or their ratio) multiplied by returns or advantages, where some ``.log_prob(...)`` reads
    sampled actions, and no reparameterised sample (SAC actors and critics train through
    ``rsample``).

    A density's log-likelihood maximised directly (a normalizing flow's
    ``base_dist.log_prob(z)``, a ``return`` of log-probabilities) is maximum likelihood, not
    a policy gradient (learned from static12, a normalizing-flow repository)."""
    if any(method_name(call) == "rsample" for call, _, _ in model.all_calls):
        return None
    products: list[cst.BinaryOperation] = []
    bound: dict[str, set[str]] = {}
    sampled: set[str] = set()
    for node in walk(model.module):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            products.append(node)
        elif isinstance(node, cst.Assign):
            names = {n for target in node.targets for n in _target_names(target.target)}
            if _samples(node.value):
                sampled |= names
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                bound.setdefault(node.targets[0].target.value, set()).update(
                    _identifiers(node.value)
                )
        elif isinstance(node, cst.For):
            _bind_zip(node, bound)
    if not any(_reads_actions(call, sampled) for call in log_probs):
        return None
    for product in products:
        left = _expanded(_identifiers(product.left), bound)
        right = _expanded(_identifiers(product.right), bound)
        if (_any(LOG_PROB, left) and _any(ADVANTAGE, right)) or (
            _any(ADVANTAGE, left) and _any(LOG_PROB, right)
        ):
            return product
    return None


def _bind_zip(loop: cst.For, bound: dict[str, set[str]]) -> None:
    """``for log_prob, R in zip(saved_log_probs, returns):``: ``R`` reads ``returns``."""
    target, it = loop.target, loop.iter
    if not (
        isinstance(target, cst.Tuple)
        and isinstance(it, cst.Call)
        and isinstance(it.func, cst.Name)
        and it.func.value == "zip"
        and len(it.args) == len(target.elements)
    ):
        return
    for element, arg in zip(target.elements, it.args, strict=True):
        if isinstance(element.value, cst.Name):
            bound.setdefault(element.value.value, set()).update(_identifiers(arg.value))


def _expanded(names: set[str], bound: dict[str, set[str]]) -> set[str]:
    """``names`` and, one level deep, what the names among them were bound from."""
    out = set(names)
    for name in names:
        out |= bound.get(name, set())
    return out


def _target_names(target: cst.BaseExpression) -> list[str]:
    return [child.value for child in walk(target) if isinstance(child, cst.Name)]


def _any(pattern: re.Pattern[str], names: set[str]) -> bool:
    return any(pattern.search(name) for name in names)


def _identifiers(node: cst.CSTNode) -> set[str]:
    """Names, attribute names and string keys under ``node`` (``batch["adv"]`` reads
    ``adv``). Keywords such as ``return`` are no identifiers, nor are argument keywords
    (``return_dict=True`` names no return)."""
    out: set[str] = set()
    skipped: set[int] = set()
    for child in walk(node):
        if isinstance(child, cst.Arg) and child.keyword is not None:
            skipped.add(id(child.keyword))
        elif isinstance(child, cst.Name) and id(child) not in skipped:
            out.add(child.value)
        elif isinstance(child, cst.SimpleString):
            out.add(child.value.strip("\"'"))
    return out


def _samples(expr: cst.BaseExpression) -> bool:
    """``expr`` draws from a distribution: ``dist.sample()`` (a ``random.sample`` draws from
    a list)."""
    for node in walk(expr):
        if isinstance(node, cst.Call) and method_name(node) == "sample":
            owner = receiver(node)
            if owner is None or not NOT_SAMPLERS.search(code_of(owner)):
                return True
    return False


def _reads_actions(call: cst.Call, sampled: set[str]) -> bool:
    """``dist.log_prob(action)``: the argument names actions, is a sampled name, or samples
    itself (``dist.log_prob(dist.sample())``)."""
    if not call.args:
        return False
    arg = call.args[0].value
    names = _identifiers(arg)
    return _any(ACTION, names) or bool(names & sampled) or _samples(arg)
