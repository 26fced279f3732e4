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
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # Its own header line first (parameter names, layers, shapes), then one line per step.
    assert len(lines) == 9
    header = lines[0]
    assert header["gradient_doctor"] == "monitor-header"
    assert header["parameters"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert header["layers"] == ["0", "0", "2", "2"]
    assert header["shapes"] == [[32, 8], [32], [1, 32], [1]]
    assert header["layer_types"] == {"0": "Linear", "2": "Linear"}
    assert [line["step"] for line in lines[1:]] == list(range(1, 9))
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


def test_a_plain_monitor_log_names_its_layers_for_the_logs_reader(tmp_path: Path) -> None:
    from gradient_doctor.probes.logs import diagnose_log

    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4))
    critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    model = nn.ModuleDict({"generator": generator, "critic": critic})
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.SGD(critic.parameters(), lr=1e-2)
    log = tmp_path / "grads.jsonl"
    with GradientMonitor(model, opt_g, log_path=log) as monitor:
        # the critic's optimizer is hooked too: its parameters join after the first header
        monitor.collector.name_model(model)
        handles = [
            opt_c.register_step_pre_hook(monitor.collector.on_step_pre),
            opt_c.register_step_post_hook(lambda o, a, k: monitor.collector.on_step_post(o)),
        ]
        for _ in range(12):
            z = torch.randn(16, 4)
            opt_g.zero_grad()
            (-critic(generator(z)).mean()).backward()
            opt_g.step()
            opt_c.zero_grad()
            critic(generator(z).detach()).pow(2).mean().backward()
            opt_c.step()
        for handle in handles:
            handle.remove()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    headers = [line for line in lines if line.get("gradient_doctor") == "monitor-header"]
    # One header per parameter set: the generator's, then the generator's and the critic's.
    assert [len(h["parameters"]) for h in headers] == [4, 8]
    assert headers[-1]["parameters"][4:] == [
        "critic.0.weight",
        "critic.0.bias",
        "critic.2.weight",
        "critic.2.bias",
    ]
    report = diagnose_log(str(log))
    assert report.format == "gradient-monitor"
    assert "layer_grad_norms" in report.series_found
    assert set(report.layers) >= {"generator.0", "generator.2", "critic.0", "critic.2"}
