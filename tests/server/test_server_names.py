"""Guessing the user's names for fix snippets."""

from __future__ import annotations

from server_helpers import EXAMPLES

from gradient_doctor.skill_server.names import guess_names
from gradient_doctor.templates.snippets import render_snippet

SCRIPT = """
import torch
net = Net()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
crit = torch.nn.CrossEntropyLoss()
scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(train_dl):
    out = crit(net(x), y)
    scaler.scale(out).backward()
    if (i + 1) % GRAD_ACC == 0:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=0.5)
        scaler.step(opt)
"""


def test_names_come_from_the_script() -> None:
    names = guess_names(SCRIPT)
    assert names == {
        "optimizer": "opt",
        "criterion": "crit",
        "scaler": "scaler",
        "model": "net",
        "accumulation_steps": "GRAD_ACC",
        "loader": "train_dl",
        "max_norm": "0.5",
        "step": "i",
        "inputs": "x",
        "targets": "y",
    }
    code = render_snippet("amp-clip", names)
    assert "scaler.unscale_(opt)" in code and "net.parameters()" in code


def test_ambiguous_names_are_left_out() -> None:
    two_optimizers = "a = torch.optim.SGD(m.parameters())\nb = torch.optim.Adam(m.parameters())\n"
    assert "optimizer" not in guess_names(two_optimizers)
    assert guess_names("print('no training here')\n") == {}


def test_example_names() -> None:
    names = guess_names((EXAMPLES / "buggy_train.py").read_text())
    assert names["criterion"] == "loss_fn" and names["accumulation_steps"] == "ACCUM_STEPS"


FUNCTIONAL = """
import torch
import torch.nn.functional as F
for batch_idx, (data, target) in enumerate(train_loader):
    optimizer.zero_grad()
    output = model(data)
    loss = F.nll_loss(output, target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    optimizer.step()
    for group in optimizer.param_groups:
        group["lr"] *= 0.99
"""


def test_batch_names_functional_loss_and_positional_max_norm() -> None:
    names = guess_names(FUNCTIONAL)
    assert names["loader"] == "train_loader", names  # not optimizer.param_groups
    assert (names["step"], names["inputs"], names["targets"]) == ("batch_idx", "data", "target")
    assert names["criterion"] == "F.nll_loss" and names["max_norm"] == "args.clip"
    code = render_snippet("nan-check-order", names)
    assert "for batch_idx, (data, target) in enumerate(train_loader):" in code
    assert "loss = F.nll_loss(model(data), target)" in code
    assert "max_norm=args.clip" in code


def test_two_ways_to_unpack_the_loader_are_left_out() -> None:
    two = "for x, y in dl:\n    pass\nfor i, (a, b) in enumerate(dl):\n    pass\n"
    names = guess_names(two)
    assert names["loader"] == "dl"
    assert not {"inputs", "targets", "step"} & names.keys()
