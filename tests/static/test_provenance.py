"""Loss provenance: only a division by the accumulation count (or by the token count of the
whole window) is accumulation scaling; other arithmetic is not; what cannot be followed is
unknown (and the rules stay silent)."""

from __future__ import annotations

import libcst as cst
import pytest

from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.provenance import loss_scaling
from gradient_doctor.probes.static.ruletools import accumulating_units

LOOP = """\
import torch
import torch.nn.functional as F
{prelude}
def train(model, loader, optimizer, accum, w, n):
    for i, batch in enumerate(loader):
{body}
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def _verdict(body: str, prelude: str = "") -> tuple[str, bool]:
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    source = LOOP.format(body=indented, prelude=prelude)
    model = FileModel(cst.parse_module(source), "train.py")
    ((unit, acc, _),) = list(accumulating_units(model))
    (backward,) = unit.backwards
    micro = unit.micro.node if unit.micro is not None else None
    scaling = loss_scaling(model, backward, acc, unit.root, micro)
    return scaling.verdict, scaling.by_counter


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        ("loss = model(batch).loss / accum", "accumulation"),
        ("loss = model(batch).loss\nloss = loss / accum", "accumulation"),
        ("loss = model(batch).loss\nloss /= accum", "accumulation"),
        ("loss = model(batch).loss * (1.0 / accum)", "accumulation"),
        ("scale = 1.0 / accum\nloss = model(batch).loss * scale", "accumulation"),
        ("loss = (F.mse_loss(*model(batch)) + w * model.reg(batch)) / accum", "accumulation"),
        ("loss = model(batch).loss.div(accum)", "accumulation"),
        ("loss = model(batch).loss", "none"),
        ("l1 = model(batch).loss\nl2 = model.aux_loss(batch)\nloss = l1 + w * l2", "none"),
        ("loss = model(batch).loss * 0.5", "none"),
        (
            "tok = F.cross_entropy(model(batch), batch, reduction='none')\n"
            "n_tokens = (batch != -100).sum()\n"
            "loss = tok.sum() / n_tokens",
            "none",
        ),
        ("loss = model(batch).loss / torch.distributed.get_world_size()", "none"),
        ("loss = model(batch).loss / n", "unknown"),
        ("loss = F.cross_entropy(model(batch), batch, reduction='sum')", "unknown"),
        ("loss = model(batch, num_items_in_batch=batch.numel()).loss", "accumulation"),
    ],
)
def test_verdicts(body: str, verdict: str) -> None:
    assert _verdict(body)[0] == verdict


def test_a_local_helper_is_followed_into_its_return() -> None:
    prelude = "def compute(model, batch, accum):\n    return model(batch).loss / accum\n"
    assert _verdict("loss = compute(model, batch, accum)", prelude)[0] == "accumulation"
    prelude = "def compute(model, batch):\n    return model(batch).loss * 0.5\n"
    assert _verdict("loss = compute(model, batch)", prelude)[0] == "none"


def test_a_window_token_count_is_accumulation_scaling() -> None:
    source = """\
import torch.nn.functional as F
def train(model, data, optimizer, micro):
    for step in range(100):
        window = [next(data) for _ in range(micro)]
        window_tokens = sum(int((b != -100).sum()) for b in window)
        for batch in window:
            loss = F.cross_entropy(model(batch), batch, reduction="sum") / window_tokens
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""
    model = FileModel(cst.parse_module(source), "train.py")
    ((unit, acc, _),) = list(accumulating_units(model))
    (backward,) = unit.backwards
    assert unit.micro is not None
    scaling = loss_scaling(model, backward, acc, unit.root, unit.micro.node)
    assert scaling.verdict == "accumulation"


def test_a_loss_passed_to_a_helper_keeps_its_history() -> None:
    source = """\
def backward_step(loss, accum):
    loss = loss / accum
    loss.backward()

def train(model, loader, optimizer, accum):
    for i, batch in enumerate(loader):
        backward_step(model(batch).loss, accum)
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
"""
    model = FileModel(cst.parse_module(source), "train.py")
    ((unit, acc, _),) = list(accumulating_units(model))
    (backward,) = unit.backwards
    assert loss_scaling(model, backward, acc, unit.root).verdict == "accumulation"
    unscaled = source.replace("    loss = loss / accum\n", "")
    model = FileModel(cst.parse_module(unscaled), "train.py")
    ((unit, acc, _),) = list(accumulating_units(model))
    (backward,) = unit.backwards
    assert loss_scaling(model, backward, acc, unit.root).verdict == "none"


def test_the_running_counter_is_not_the_accumulation_count() -> None:
    source = """\
def train(model, loader, optimizer, accum):
    count = 0
    for batch in loader:
        count += 1
        loss = model(batch) / count
        loss.backward()
        if count >= accum:
            optimizer.step()
            optimizer.zero_grad()
            count = 0
"""
    model = FileModel(cst.parse_module(source), "train.py")
    ((unit, acc, _),) = list(accumulating_units(model))
    assert acc.counter == "count" and acc.divisor_text == "accum"
    (backward,) = unit.backwards
    scaling = loss_scaling(model, backward, acc, unit.root)
    assert scaling.verdict == "none" and scaling.by_counter


def test_an_assignment_on_some_paths_only_keeps_the_earlier_value() -> None:
    # Divided only when `scale` is set: on the other path the loss reaches backward undivided.
    body = "loss = model(batch).loss\nif w:\n    loss = loss / accum"
    assert _verdict(body)[0] == "unknown"
    # Both branches of an if/else assign: one of them always runs.
    body = "if w:\n    loss = model(batch).loss / accum\nelse:\n    loss = model(batch).aux / accum"
    assert _verdict(body)[0] == "accumulation"
    body = "if w:\n    loss = model(batch).loss\nelse:\n    loss = model(batch).aux"
    assert _verdict(body)[0] == "none"
