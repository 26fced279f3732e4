"""Several optimizers are named as the script names them (``optimizerG``, ``self.opt_d``), and
by their index where the probe cannot tell (a loop variable shared by both, a list entry)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

GAN = """
import torch
from torch import nn

class Trainer:
    def __init__(self):
        self.net_d = nn.Linear(4, 1)
        self.net_g = nn.Linear(2, 4)
        self.opt_d = torch.optim.Adam(self.net_d.parameters(), lr=1e-3)

    def step_d(self, real):
        self.opt_d.zero_grad()
        fake = self.net_g(torch.randn(8, 2)).detach()
        (self.net_d(real).mean() - self.net_d(fake).mean()).backward()
        self.opt_d.step()

trainer = Trainer()
optimizerG = torch.optim.SGD(trainer.net_g.parameters(), lr=1e-2)
for _ in range(20):
    trainer.step_d(torch.randn(8, 4))
    optimizerG.zero_grad()
    (-trainer.net_d(trainer.net_g(torch.randn(8, 2))).mean()).backward()
    optimizerG.step()
"""

# Both optimizers step through one loop variable: the name says nothing about which is which.
SHARED = """
import torch
a, b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
optimizers = [torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.Adam(b.parameters())]
for _ in range(20):
    x = torch.randn(8, 4)
    for opt in optimizers:
        opt.zero_grad()
    (a(x).pow(2).mean() + b(x).pow(2).mean()).backward()
    for opt in optimizers:
        opt.step()
"""


def _probe(tmp_path: Path, source: str, *extra: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(source)
    done = run_cli("probe", str(script), "--steps", "10", "--python", sys.executable, *extra)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


@pytest.mark.slow
def test_the_scripts_own_optimizer_names(tmp_path: Path) -> None:
    report = json.loads(_probe(tmp_path, GAN, "--format", "json"))
    assert report["optimizer_kinds"] == ["Adam", "SGD"]
    assert report["optimizer_names"] == ["opt_d", "optimizerG"]
    text = _probe(tmp_path, GAN)
    row = next(line for line in text.splitlines() if line.startswith("| Optimizers |"))
    assert "`opt_d` (Adam): total ‖g‖ median " in row and "`optimizerG` (SGD): total ‖g‖ " in row
    assert row.count("(5 steps)") == 2
    assert "optimizer 0" not in text and "optimizer 1" not in text


@pytest.mark.slow
def test_an_unsure_name_falls_back_to_the_index(tmp_path: Path) -> None:
    report = json.loads(_probe(tmp_path, SHARED, "--format", "json"))
    assert report["optimizer_names"] == ["opt", "opt"]  # what the probe saw...
    text = _probe(tmp_path, SHARED)
    row = next(line for line in text.splitlines() if line.startswith("| Optimizers |"))
    # ...is no name for either: both are named by their index.
    assert "optimizer 0 (SGD)" in row and "optimizer 1 (Adam)" in row and "`opt`" not in row


def test_labels_in_findings_and_plots() -> None:
    from gradient_doctor.probes.runtime.result import optimizer_label

    assert optimizer_label(1, ["Adam", "SGD"], ["netD_opt", "optimizerG"]) == "`optimizerG` (SGD)"
    assert optimizer_label(1, ["Adam", "SGD"], [None, None]) == "optimizer 1 (SGD)"
    assert optimizer_label(0, ["Adam"], None) == "optimizer 0 (Adam)"
    assert optimizer_label(0, ["SGD", "SGD"], ["opt", "opt"]) == "optimizer 0 (SGD)"
