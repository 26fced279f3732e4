"""The child-side hooks and collector, driven in process by tiny real training loops."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from gradient_doctor.probes.runtime.child import hooks
from gradient_doctor.probes.runtime.child.collector import Collector, ProbeStop


@pytest.fixture
def probe() -> Iterator[Callable[..., tuple[Collector, list[dict[str, Any]]]]]:
    uninstalls: list[Callable[[], None]] = []

    def start(**options: Any) -> tuple[Collector, list[dict[str, Any]]]:
        records: list[dict[str, Any]] = []
        collector = Collector(records.append, **options)
        uninstalls.append(hooks.install(collector))
        return collector, records

    yield start
    for undo in uninstalls:
        undo()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))


def test_hooks_are_removed_again() -> None:
    original = (
        torch.autograd.backward,
        torch.nn.utils.clip_grad_norm_,
        torch.optim.Optimizer.zero_grad,
    )
    undo = hooks.install(Collector(lambda record: None))
    assert torch.autograd.backward is not original[0]
    undo()
    assert (
        torch.autograd.backward,
        torch.nn.utils.clip_grad_norm_,
        torch.optim.Optimizer.zero_grad,
    ) == original


def test_stops_after_n_steps_and_records_order(probe: Any) -> None:
    collector, records = probe(max_steps=3, sample_every=2)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    with torch.no_grad():
        first_loss = nn.functional.mse_loss(model(x), y).item()
    steps = 0
    with pytest.raises(ProbeStop):
        for _ in range(10):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            steps += 1
    assert steps == 3  # stopped at the first training call after step 3
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["events"] == ["zero-grad", "backward", "clip", "step"]
    assert records[1]["events"] == ["scheduler", "zero-grad", "backward", "clip", "step"]
    assert collector.parameters == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert collector.layers == ["0", "0", "2", "2"]
    first = records[0]
    assert first["losses"][0] == pytest.approx(first_loss, rel=1e-6)
    assert first["loss_ops"] == ["MseLossBackward0"]
    assert first["clip_max_norm"] == 0.5
    assert first["clipped"] == (first["total_norm_before_clip"] > 0.5)
    if first["clipped"]:
        assert first["total_norm"] == pytest.approx(0.5, rel=1e-4)
    # Sampled steps: the first, and every second one; they carry details and dead units.
    assert [r["sampled"] for r in records] == [True, True, False]
    assert "detail" in records[0] and "dead_units" in records[0]


def test_norms_are_those_the_step_consumes(probe: Any) -> None:
    _, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[float]] = []
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 6)).pow(2).mean().backward()
        seen.append([p.grad.double().norm().item() for p in model.parameters()])  # type: ignore[union-attr]
        optimizer.step()
    for rec, expected in zip(records, seen, strict=True):
        assert rec["grad_norms"] == pytest.approx(expected, rel=1e-5)
        assert rec["total_norm"] == pytest.approx(math.sqrt(sum(v * v for v in expected)), rel=1e-5)


def test_grad_scaler_on_cpu_records_scale_and_skips(probe: Any) -> None:
    _, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(8, 6))
        loss = out.float().pow(2).mean()
        if step == 1:
            loss = loss * math.inf  # an overflow: the scaler must skip this step
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    assert [r["skipped"] for r in records] == [False, True, False]
    assert records[0]["scale"] == 2.0**16
    assert records[2]["scale"] == 2.0**15  # halved after the skipped step
    assert records[0]["events"] == [
        "zero-grad",
        "scale",
        "backward",
        "unscale",
        "clip",
        "scaler-step",
        "step",
    ]


def test_forked_copies_stay_silent(probe: Any) -> None:
    collector, records = probe()
    collector.pid = -1  # as in a forked DataLoader worker: not the process that installed it
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    assert records == [] and collector.steps_done == 0


@pytest.mark.skipif(
    not hasattr(torch.nn.utils, "clip_grads_with_norm_"), reason="torch without split clipping"
)
def test_split_clipping_api_is_seen(probe: Any) -> None:
    _, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    model(torch.randn(8, 6)).pow(2).mean().backward()
    params = list(model.parameters())
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    torch.nn.utils.clip_grads_with_norm_(params, 1e-3, total)
    optimizer.step()
    (record,) = records
    assert record["events"] == ["zero-grad", "backward", "clip", "step"]
    assert record["total_norm_before_clip"] == pytest.approx(float(total))
    assert record["clipped"] is True
    assert record["total_norm"] == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize(
    ("activation", "expect_hooks"), [(nn.ReLU, True), (nn.GELU, False)], ids=["relu", "gelu"]
)
def test_sampled_windows_hook_forwards_only_when_there_are_units_to_count(
    probe: Any, activation: type[nn.Module], expect_hooks: bool
) -> None:
    collector, records = probe(sample_every=2)
    wanted: list[bool] = []
    install_hooks = collector.forward_hooks_wanted
    assert install_hooks is not None

    def spy(on: bool) -> None:
        wanted.append(on)
        install_hooks(on)

    collector.forward_hooks_wanted = spy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), activation(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    # Windows after steps 1..5: step 2 and 4 are sampled, 3 and 5 are plain.
    assert wanted == [expect_hooks, False, expect_hooks, False, expect_hooks]
    sampled = [r for r in records if r["sampled"] and r["step"] > 1]
    assert [r["step"] for r in sampled] == [2, 4]
    # Dead units are still counted where there are ReLU units; norms and details everywhere.
    assert all(("dead_units" in r) == expect_hooks for r in sampled)
    assert all(r["detail"] is not None for r in sampled)


def _episode(model: nn.Module, optimizer: Any, states: list[torch.Tensor]) -> None:
    """An RL-shaped step: one small forward per environment state, one update."""
    outputs = [model(state) for state in states]
    optimizer.zero_grad()
    torch.stack(outputs).sum().backward()
    optimizer.step()


def test_many_small_inputs_per_step_are_checked_together(probe: Any) -> None:
    collector, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        states = [torch.randn(1, 6) for _ in range(50)]
        if step == 1:
            states[17][0, 3] = math.nan  # one environment state of the second step
        _episode(model, optimizer, states)
        # Held until the step, then checked and let go.
        assert not collector.window.held_inputs
    assert [r["inputs_finite"] for r in records] == [True, False, True]


def test_held_small_inputs_are_bounded_and_large_ones_checked_at_once(
    probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradient_doctor.probes.runtime.child import collector as collector_module

    monkeypatch.setattr(collector_module, "HELD_INPUT_LIMIT", 6 * 10)
    collector, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    held: list[int] = []
    outputs = []
    for index in range(25):
        state = torch.randn(1, 6)
        if index == 3:
            state[0, 0] = math.inf  # checked in an early batch of held inputs
        outputs.append(model(state))
        held.append(len(collector.window.held_inputs))
    assert max(held) <= 11
    big = torch.randn(collector_module.SMALL_INPUT // 6 + 1, 6)
    outputs.append(model(big).sum(0, keepdim=True))
    assert len(collector.window.held_inputs) == held[-1]  # the large batch was not held
    optimizer.zero_grad()
    torch.stack(outputs).sum().backward()
    optimizer.step()
    assert records[-1]["inputs_finite"] is False


def test_a_buffer_refilled_in_place_for_each_forward_is_checked_at_once(probe: Any) -> None:
    collector, records = probe(sample_every=100)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    buffer = torch.zeros(1, 6)
    with torch.no_grad():  # a rollout: the refilled buffer is not saved for backward
        for index in range(5):
            buffer.copy_(torch.randn(1, 6))
            if index == 3:
                buffer[0, 2] = math.nan
            model(buffer)
            buffer.fill_(0.0)  # the next state overwrites it
    assert not collector.window.held_inputs
    loss = model(torch.randn(4, 6)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert records[-1]["inputs_finite"] is False
