"""A ``GradientMonitor`` that writes the JSONL ``gradient-doctor logs`` reads, for wrapped models.

The monitor writes one :class:`~probes.runtime.result.StepRecord` per optimizer step, after a
header line naming the parameters, their layers, shapes and module types
(``probes.logs.formats.monitor.header_record``), so the reader can fold the per-parameter norms
into layers and run the per-layer checks. :class:`MonitorLog` adds what the integrations need:
unwrapping DDP/Accelerate/Lightning wrappers and catching the loss a model returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradient_doctor.probes.runtime.monitor import GradientMonitor


def unwrap_model(model: Any) -> nn.Module:
    """The user's module inside DDP/FSDP/Accelerate wrappers (``.module``)."""
    inner = model
    while isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    return inner


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside Accelerate's or Lightning's wrapper (``.optimizer``).

    The step hooks must be on the optimizer whose ``step()`` really runs; a wrapper that does
    not call ``Optimizer.__init__`` never runs hooks registered on itself.
    """
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    return inner


class MonitorLog:
    """``GradientMonitor`` on ``model``/``optimizer`` writing ``path``, plus its header line.

    ``capture_calls=True`` also installs the probe's global hooks while attached: the log then
    holds the order of training calls, the clip's ``max_norm`` and the GradScaler's skipped
    steps (a skipped step never reaches ``optimizer.step()``, so without it the log has no
    record of them), at the cost of wrapping those torch functions for the whole run.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        path: str | os.PathLike[str],
        *,
        sample_every: int = 10,
        profile: str | None = None,
        capture_loss: bool = True,
        capture_calls: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.model = unwrap_model(model)
        self.monitor = GradientMonitor(
            self.model,
            unwrap_optimizer(optimizer),
            sample_every=sample_every,
            profile=profile,
            log_path=self.path,
            capture_calls=capture_calls,
        )
        self._loss_hook: Any = None
        if capture_loss:
            self._loss_hook = self.model.register_forward_hook(self._grab_loss)

    def _grab_loss(self, module: nn.Module, args: Any, output: Any) -> None:
        """A model that returns its loss (HF models: ``output.loss``): hand it to the monitor
        while training (no device sync: the monitor reads it with the step's other values)."""
        if not module.training:
            return
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1:
            self.monitor.observe_loss(loss)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Give the monitor the loss about to be given to ``backward()``."""
        self.monitor.observe_loss(loss)

    def close(self) -> None:
        """Stop measuring and close the log (idempotent)."""
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        self.monitor.detach()
