"""The probe's child side: what runs inside the user's interpreter, around the user's script.

This package imports only the standard library, torch, and itself (relative imports). The
parent (``probes.runtime.runner``) copies it into a private folder and runs it there as
:data:`STAGED_PACKAGE`, so that neither the tool's other packages (pydantic, libcst, mcp, ...)
nor its top-level names enter the user's process: a project with its own ``probes`` package
imports its own. In-process use (``GradientMonitor``) imports the same modules from here.
"""

from __future__ import annotations

#: The name the child package runs under in the user's interpreter (``python -m NAME``).
#: Chosen so that no user project plausibly has a package of that name.
STAGED_PACKAGE = "_gradient_doctor_probe"
