"""``GradientMonitor`` in an Accelerate loop (or any hand-written loop): the recipe.

    from accelerate import Accelerator
    from gradient_doctor.probes.integrations.accelerate import monitor

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    grads = monitor(accelerator, model, optimizer, "grads.jsonl")   # None off the main process
    for batch in loader:
        loss = model(**batch).loss
        if grads:
            grads.observe_loss(loss)        # optional: lets the report read the loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()                    # measured here, by the optimizer's own hooks
        optimizer.zero_grad()
    if grads:
        grads.close()
    # then: gradient-doctor logs grads.jsonl

Accelerate wraps the model (DDP, ``.module``) and the optimizer (``AcceleratedOptimizer``,
``.optimizer``); :func:`monitor` unwraps both so the hooks sit on the optimizer that really
steps. With gradient accumulation (``accelerator.accumulate``), the inner optimizer steps only on
synchronising micro-batches, so one record is one real update. Without Accelerate, build
:class:`~probes.integrations.monitor_log.MonitorLog` (or ``GradientMonitor``) directly.
"""

from __future__ import annotations

import os
from typing import Any

from gradient_doctor.probes.integrations.monitor_log import MonitorLog


def monitor(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    log_path: str | os.PathLike[str] = "gradient_doctor.jsonl",
    *,
    sample_every: int = 10,
    profile: str | None = None,
) -> MonitorLog | None:
    """A :class:`MonitorLog` on the prepared ``model``/``optimizer`` for the main process, None
    on the others (their gradients are the same after synchronisation)."""
    if not getattr(accelerator, "is_main_process", True):
        return None
    return MonitorLog(
        model,
        optimizer,
        log_path,
        sample_every=sample_every,
        profile=profile,
        capture_loss=False,  # the loop hands the loss over (observe_loss)
    )
