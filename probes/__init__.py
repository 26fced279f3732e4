"""What we measure: ``probes.static`` reads a script, ``probes.runtime`` runs it.

Importing this package imports nothing: the names below load on first use (PEP 562), so the
static analyser and the MCP server stay torch-free (``GradientMonitor``), and the probe's
launcher (``probes.runtime.launch``, standard library only) starts the script before pydantic
and the finding model are imported (``Finding``, ``Fix``, ``Severity``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradient_doctor.knowledge.findings import Finding, Fix, Severity
    from gradient_doctor.probes.runtime.monitor import GradientMonitor

__all__ = ["Finding", "Fix", "GradientMonitor", "Severity"]

_HOMES = {
    "Finding": "gradient_doctor.knowledge.findings",
    "Fix": "gradient_doctor.knowledge.findings",
    "Severity": "gradient_doctor.knowledge.findings",
    "GradientMonitor": "gradient_doctor.probes.runtime.monitor",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'probes' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
