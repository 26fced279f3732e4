"""``GradientMonitor``: the probe's measurements inside your own training loop (imports torch).

    monitor = GradientMonitor(model, optimizer, log_path="grads.jsonl")
    for batch in loader:
        loss = loss_fn(model(batch.x), batch.y)
        monitor.observe_loss(loss)          # optional: lets the diagnosis read the loss
        loss.backward()
        optimizer.step()                    # measured here, through the optimizer's hooks
        optimizer.zero_grad()
    print(monitor.report().findings)

Statistics are gathered by the optimizer's own step hooks (per-tensor norms every step, the
richer statistics and dead-unit counts every ``sample_every`` steps), exactly as in the probe's
child process; ``report()`` returns the same :class:`~probes.runtime.result.ProbeResult`.
With ``capture_calls=True`` the monitor also installs the probe's global hooks for as long as it
is attached, so it sees clipping, GradScaler, scheduler and ``zero_grad`` calls and every loss
given to ``backward()`` (what the order-of-calls checks need).

With ``log_path`` every record is appended to that JSONL file, after a header line naming the
parameters, their layers, shapes and module types (written again if parameters join later, as
with a second optimizer): ``gradient-doctor logs`` reads the file with per-layer names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from gradient_doctor.probes.runtime.child.collector import Collector
from gradient_doctor.probes.runtime.diagnose import build_result, resolve_profile
from gradient_doctor.probes.runtime.result import ChildSummary, ProbeResult, StepRecord


class GradientMonitor:
    """Measure the gradients ``optimizer`` applies to ``model``'s parameters, step by step."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        sample_every: int = 10,
        profile: str | None = None,
        log_path: str | Path | None = None,
        capture_calls: bool = False,
        attach: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.profile = resolve_profile(profile)
        self.records: list[StepRecord] = []
        self._log: IO[str] | None = None
        self._log_path = Path(log_path) if log_path is not None else None
        self._header_parameters = 0
        """How many parameters the last header line written to the log named."""
        self._capture_calls = capture_calls
        self._handles: list[RemovableHandle] = []
        self._forward_handles: list[RemovableHandle] = []
        self._uninstall: Callable[[], None] | None = None
        self._started = time.perf_counter()
        self.collector = Collector(self._keep, sample_every=sample_every)
        self.collector.name_model(model)
        if attach:
            self.attach()

    def _keep(self, record: dict[str, Any]) -> None:
        self.records.append(StepRecord.model_validate(record))
        if self._log is not None:
            if len(self.collector.parameters) != self._header_parameters:
                self._write_header()
            self._log.write(json.dumps(record, allow_nan=True, separators=(",", ":")) + "\n")
            self._log.flush()

    def _write_header(self) -> None:
        """The header line before the records it names: the per-parameter norms of a record
        are aligned with the collector's parameters, which are known once a step ran (and
        grow when another optimizer's parameters join)."""
        from gradient_doctor.probes.logs.formats.monitor import dumps, header_record

        assert self._log is not None
        self._header_parameters = len(self.collector.parameters)
        self._log.write(dumps(header_record(self.collector.summary())) + "\n")

    def attach(self) -> None:
        """Start measuring (idempotent)."""
        if self._handles or self._uninstall is not None:
            return
        if self._log_path is not None and self._log is None:
            self._log = self._log_path.open("a", encoding="utf-8")
            self._header_parameters = 0  # a reopened log gets its header again
        if self._capture_calls:
            from gradient_doctor.probes.runtime.child import hooks

            self._uninstall = hooks.install(self.collector)
            return
        collector = self.collector
        self._handles = [
            self.optimizer.register_step_pre_hook(collector.on_step_pre),
            self.optimizer.register_step_post_hook(lambda opt, a, k: collector.on_step_post(opt)),
        ]
        collector.forward_hooks_wanted = self._want_forward_hooks
        self._want_forward_hooks(True)

    def _want_forward_hooks(self, wanted: bool) -> None:
        if wanted and not self._forward_handles:
            collector = self.collector
            for module in self.model.modules():
                self._forward_handles.append(
                    module.register_forward_pre_hook(
                        lambda m, args: collector.on_forward_pre(m, args)
                    )
                )
                self._forward_handles.append(
                    module.register_forward_hook(
                        lambda m, args, out: collector.on_forward_post(m, out)
                    )
                )
        elif not wanted:
            for handle in self._forward_handles:
                handle.remove()
            self._forward_handles.clear()

    def detach(self) -> None:
        """Stop measuring and close the JSONL log (idempotent)."""
        if self._uninstall is not None:
            self._uninstall()
            self._uninstall = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._want_forward_hooks(False)
        self.collector.remove_root_hooks()
        self.collector.forward_hooks_wanted = None
        self.collector.flush()
        if self._log is not None:
            self._log.close()
            self._log = None

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Tell the monitor the loss about to be given to ``backward()`` (no sync)."""
        if self._capture_calls:
            return  # the global backward hook already records it
        self.collector.on_backward(loss)

    def report(self) -> ProbeResult:
        """Diagnose the steps measured so far (same result type as the probe)."""
        self.collector.flush()
        summary = ChildSummary.model_validate(
            {
                "status": "ok" if self.records else "no-training-loop",
                "message": None if self.records else "no optimizer step was measured",
                "torch_version": torch.__version__,
                "script_s": time.perf_counter() - self._started,
                **self.collector.summary(),
            }
        )
        return build_result(
            script="<GradientMonitor>",
            args=[],
            steps_requested=len(self.records),
            sample_every=self.collector.sample_every,
            records=self.records,
            summary=summary,
            profile=self.profile,
            wall_s=time.perf_counter() - self._started,
        )

    def __enter__(self) -> GradientMonitor:
        self.attach()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()
