"""A Lightning ``Callback`` that runs ``GradientMonitor`` for the whole ``fit``.

    from gradient_doctor.probes.integrations.lightning import GradientDoctorCallback

    trainer = L.Trainer(max_steps=10_000, callbacks=[GradientDoctorCallback("grads.jsonl")])
    trainer.fit(model, data)
    # then: gradient-doctor logs grads.jsonl

Works with ``lightning`` (``lightning.pytorch``) and the older ``pytorch_lightning`` package.
The hooks sit on the first optimizer ``configure_optimizers`` returns; the loss comes from
Lightning's ``on_before_backward``. Only the global-zero process writes.

Lightning's automatic optimisation steps with a closure: forward and backward run inside
``optimizer.step(closure)``. The monitor measures in the optimizer's step pre-hook, so it needs
the collector's closure support (measuring after the closure ran) to attribute each step's
gradients and loss to that step; without it the norms lag one step behind and the loss is not
recorded.
"""

from __future__ import annotations

import os
from typing import Any

from gradient_doctor.probes.integrations.monitor_log import MonitorLog

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback  # type: ignore[assignment]


class GradientDoctorCallback(Callback):  # type: ignore[misc]
    """Write a ``GradientMonitor`` JSONL during ``Trainer.fit``."""

    def __init__(
        self,
        log_path: str | os.PathLike[str] = "gradient_doctor.jsonl",
        *,
        sample_every: int = 10,
        profile: str | None = None,
    ) -> None:
        self.log_path = log_path
        self.sample_every = sample_every
        self.profile = profile
        self.log: MonitorLog | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero or not trainer.optimizers:
            return
        self.log = MonitorLog(
            pl_module,
            trainer.optimizers[0],
            self.log_path,
            sample_every=self.sample_every,
            profile=self.profile,
            capture_loss=False,  # on_before_backward hands it over
        )

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.log is not None:
            self.log.observe_loss(loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
