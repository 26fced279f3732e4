"""The runtime gradient probe: run a training script for N steps under torch hooks.

Parent side (``runner``, ``supervisor``, ``interpreter``, ``diagnose``, ``result``) never
imports torch; the child package (``child``: hooks, collector, measure) does, in the user's
interpreter. In-loop use: ``from gradient_doctor.probes import GradientMonitor``.

The names below load on first use (PEP 562), so that importing a light submodule such as
``probes.runtime.launch`` does not pull in the runner and its models.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradient_doctor.probes.runtime.launch import Launch, ProbeInputError
    from gradient_doctor.probes.runtime.result import ProbeResult, StepRecord
    from gradient_doctor.probes.runtime.runner import run_probe, run_probe_async

_HOMES = {
    "Launch": "launch",
    "ProbeResult": "result",
    "StepRecord": "result",
    "ProbeInputError": "launch",
    "run_probe": "runner",
    "run_probe_async": "runner",
}

__all__ = ["Launch", "ProbeInputError", "ProbeResult", "StepRecord", "run_probe", "run_probe_async"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
