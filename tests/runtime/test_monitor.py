"""``GradientMonitor`` inside a user's own loop."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from gradient_doctor.probes import GradientMonitor
from gradient_doctor.probes.runtime.result import ProbeResult


def test_monitor_reports_and_logs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    log = tmp_path / "grads.jsonl"
    expected = []
    with GradientMonitor(model, optimizer, sample_every=4, log_path=log) as monitor:
        for _ in range(8):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            monitor.observe_loss(loss)
            loss.backward()
            expected.append(sum(p.grad.double().norm() ** 2 for p in model.parameters()) ** 0.5)  # type: ignore[union-attr]
            optimizer.step()
    result = monitor.report()
    assert isinstance(result, ProbeResult)
    assert result.status == "ok" and result.steps == 8
    assert result.parameters == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [f.id for f in result.findings] == ["healthy"]
    for got, want in zip(result.total_norm, expected, strict=True):
        assert abs(got - float(want)) <= 1e-5 * float(want)
    lines = log.read_text().splitlines()
    assert len(lines) == 8
    assert json.loads(lines[3])["step"] == 4
    # Detached: further steps are not measured.
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    assert monitor.report().steps == 8


def test_monitor_sees_exploding_gradients() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(6)]
    for layer in layers:
        nn.init.normal_(layer.weight, std=1.5)
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
    monitor = GradientMonitor(model, optimizer)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
    monitor.detach()
    assert "exploding-gradients" in [f.id for f in monitor.report().findings]
