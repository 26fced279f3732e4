"""What we measure: ``probes.static`` reads a script, ``probes.runtime`` runs it.

Importing this package never imports torch; ``GradientMonitor`` is resolved lazily so the
static analyser and the MCP server stay torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradient_doctor.knowledge.findings import Finding, Fix, Severity

if TYPE_CHECKING:
    from gradient_doctor.probes.runtime.monitor import GradientMonitor

__all__ = ["Finding", "Fix", "GradientMonitor", "Severity"]


def __getattr__(name: str) -> Any:
    if name == "GradientMonitor":
        from gradient_doctor.probes.runtime.monitor import GradientMonitor

        return GradientMonitor
    raise AttributeError(f"module 'probes' has no attribute {name!r}")
