"""A Hugging Face ``TrainerCallback`` that runs ``GradientMonitor`` for the whole training run.

    from gradient_doctor.probes.integrations.transformers import GradientDoctorCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[GradientDoctorCallback()])
    trainer.train()
    # then: gradient-doctor logs <output_dir>/gradient_doctor.jsonl

The monitor's hooks sit on the optimizer the Trainer steps (unwrapped from Accelerate's
``AcceleratedOptimizer``), so they see the gradients the update applies: after the Trainer's
clipping (``max_grad_norm``) and GradScaler unscaling. The loss is taken from the model's output
(``output.loss``) in training mode. Only the main process writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gradient_doctor.probes.integrations.monitor_log import MonitorLog

DEFAULT_NAME = "gradient_doctor.jsonl"


class GradientDoctorCallback(TrainerCallback):  # type: ignore[misc]
    """Write a ``GradientMonitor`` JSONL during ``Trainer.train()``.

    ``log_path``: where (default ``<output_dir>/gradient_doctor.jsonl``); ``sample_every``:
    richer statistics every K steps; ``profile``: the threshold profile of ``report()``.
    """

    def __init__(
        self,
        log_path: str | os.PathLike[str] | None = None,
        *,
        sample_every: int = 10,
        profile: str | None = None,
    ) -> None:
        self.log_path = log_path
        self.sample_every = sample_every
        self.profile = profile
        self.log: MonitorLog | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if not state.is_world_process_zero or model is None or optimizer is None:
            return
        path = Path(self.log_path or Path(args.output_dir) / DEFAULT_NAME)
        self.log = MonitorLog(
            model, optimizer, path, sample_every=self.sample_every, profile=self.profile
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.log is not None:
            self.log.close()
