"""The runtime gradient probe: run a training script for N steps under torch hooks.

Parent side (this package's ``runner``, ``diagnose``, ``result``, ``channel``) never imports
torch; the child process (``_child``, ``hooks``, ``collector``, ``measure``) does. In-loop use:
``from probes import GradientMonitor``.
"""

from __future__ import annotations

from gradient_doctor.probes.runtime.result import ProbeResult, StepRecord
from gradient_doctor.probes.runtime.runner import (
    Launch,
    ProbeInputError,
    run_probe,
    run_probe_async,
)

__all__ = ["Launch", "ProbeInputError", "ProbeResult", "StepRecord", "run_probe", "run_probe_async"]
