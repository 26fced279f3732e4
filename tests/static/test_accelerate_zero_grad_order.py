"""Accelerate's own mechanics behind ``accum-zero-grad-every-microstep`` inside
``accelerator.accumulate()``.

``AcceleratedOptimizer.zero_grad`` only zeroes when ``sync_gradients`` is True, and
``accumulate()`` sets that flag on entering the last micro-batch of a window. A
``zero_grad()`` written before the backward therefore runs on exactly that micro-batch and
wipes what the earlier ones accumulated: the window's update sees one micro-batch, divided by
N. Written after the step, the same call is the documented order. Each loop below is run with
the real library (on the CPU) and linted as text, so the finding and the mechanics are
checked on the same code. (Also described in huggingface/accelerate issue 1299.)
"""

from __future__ import annotations

from typing import Any

import pytest

from gradient_doctor.probes.static import lint_source

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip(
    "accelerate", reason="the mechanics need the real Accelerate library"
)

RULE = "accum-zero-grad-every-microstep"
WINDOW = 4

PREAMBLE = f"""
from accelerate import Accelerator
accelerator = Accelerator(cpu=True, gradient_accumulation_steps={WINDOW})
model, optimizer, batches = accelerator.prepare(model, optimizer, batches)
"""

ZERO_FIRST = (
    PREAMBLE
    + """
for inputs, targets in batches:
    with accelerator.accumulate(model):
        optimizer.zero_grad()
        loss = ((model(inputs) - targets) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
"""
)

ZERO_AFTER_STEP = (
    PREAMBLE
    + """
for inputs, targets in batches:
    with accelerator.accumulate(model):
        loss = ((model(inputs) - targets) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""
)


def _reset_accelerate() -> None:
    """Accelerate keeps its state in process-wide singletons; each run starts fresh."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _micro_batches() -> list[tuple[Any, Any]]:
    generator = torch.Generator().manual_seed(7)
    return [
        (torch.randn(2, 3, generator=generator), torch.randn(2, 1, generator=generator))
        for _ in range(WINDOW)
    ]


def _fresh_model() -> Any:
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25, 1.0]]))
    return model


def _gradient(model: Any, inputs: Any, targets: Any) -> Any:
    model.zero_grad()
    ((model(inputs) - targets) ** 2).mean().backward()
    return model.weight.grad.detach().clone()


def _window_update(source: str) -> Any:
    """Run ``source`` over one window of micro-batches; the change of the weight (with SGD at
    learning rate 1 it is minus the gradient the step used)."""
    _reset_accelerate()
    model = _fresh_model()
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = torch.utils.data.DataLoader(_micro_batches(), batch_size=None)
    namespace: dict[str, Any] = {"model": model, "optimizer": optimizer, "batches": loader}
    try:
        exec(compile(source, "<accumulate-loop>", "exec"), namespace)
    finally:
        _reset_accelerate()
    return namespace["model"].weight.detach().clone() - before


def test_zero_grad_before_backward_keeps_only_the_last_micro_batch() -> None:
    batches = _micro_batches()
    probe = _fresh_model()
    grads = [_gradient(probe, x, y) for x, y in batches]
    window_mean = torch.stack(grads).mean(0)
    last_only = grads[-1] / WINDOW

    update = _window_update(ZERO_FIRST)
    assert torch.allclose(update, -last_only, atol=1e-6)
    assert not torch.allclose(update, -window_mean, atol=1e-3)

    # The documented order (zero after the step) gives the mean over the window.
    assert torch.allclose(_window_update(ZERO_AFTER_STEP), -window_mean, atol=1e-6)


def test_the_rule_flags_the_order_that_loses_micro_batches_only() -> None:
    flagged = lint_source(ZERO_FIRST, select=[RULE])
    assert flagged.error is None
    assert [(f.id, f.line) for f in flagged.findings] == [(RULE, 8)]
    fine = lint_source(ZERO_AFTER_STEP, select=[RULE])
    assert fine.error is None
    assert fine.findings == []
