"""A small harness that renders fix snippets and runs the rendered code on tiny CPU models.

The code that runs is exactly what ``render_snippet`` returns: it is compiled and executed in
a namespace holding the model, optimizer, loader... that the snippet expects. Gradients are
captured at the moment the optimizer consumes them, through an optimizer step pre-hook, so
the checks see what the update really used (after clipping, after unscaling).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from gradient_doctor.templates.snippets import render_snippet

Grads = dict[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]

# Ids of snippets whose rendered code has been executed in this process.
EXECUTED: set[str] = set()


def exec_snippet(
    snippet_id: str,
    namespace: dict[str, Any],
    names: Mapping[str, str | int | float] | None = None,
) -> dict[str, Any]:
    """Render ``snippet_id`` with ``names`` and execute it in ``namespace`` (returned).

    Warnings are errors: a fix snippet must not trigger deprecation or misuse warnings.
    """
    code = render_snippet(snippet_id, names)
    compiled = compile(code, f"<snippet {snippet_id}>", "exec")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compiled, namespace)
    EXECUTED.add(snippet_id)
    return namespace


def mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """A small seeded MLP: 6 inputs, 3 outputs."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    ).to(dtype)


def regression_batches(
    count: int, batch_size: int = 4, seed: int = 1, dtype: torch.dtype = torch.float64
) -> list[Batch]:
    """``count`` seeded micro-batches of (inputs [B, 6], targets [B, 3])."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch_size, 6, generator=generator, dtype=dtype),
            torch.randn(batch_size, 3, generator=generator, dtype=dtype) * 3,
        )
        for _ in range(count)
    ]


class StepRecorder:
    """Records the gradients each ``optimizer.step()`` is about to apply."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.steps: list[Grads] = []
        self._handle = optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads: Grads = {}
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    grads[self.names[id(parameter)]] = parameter.grad.detach().clone()
        self.steps.append(grads)

    def remove(self) -> None:
        self._handle.remove()


def reference_grads(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Grads:
    """Gradients of one big batch made of ``batches`` (on a copy of ``model``)."""
    twin = copy.deepcopy(model)
    twin.zero_grad(set_to_none=True)
    inputs, targets = zip(*batches, strict=True)
    loss_fn(twin(torch.cat(inputs)), torch.cat(targets)).backward()
    return {
        name: p.grad.detach().clone() for name, p in twin.named_parameters() if p.grad is not None
    }


def total_norm(grads: Grads) -> float:
    """The global L2 norm over all gradients."""
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])))


def max_abs_diff(left: Grads, right: Grads) -> float:
    """Largest element-wise difference; the two must hold the same parameters."""
    assert left.keys() == right.keys(), (sorted(left), sorted(right))
    return max(float((left[name] - right[name]).abs().max()) for name in left)


def scaled(grads: Grads, factor: float) -> Grads:
    """Every gradient multiplied by ``factor``."""
    return {name: grad * factor for name, grad in grads.items()}


def clipped(grads: Grads, max_norm: float) -> Grads:
    """What norm clipping to ``max_norm`` turns ``grads`` into."""
    norm = total_norm(grads)
    return scaled(grads, min(1.0, max_norm / (norm + 1e-6)))
