"""How the probed script's process is launched: a small value shared by the CLI and the server.

Standard library only, so that building the server (which stores one) imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Launch:
    """Where and how the script's process runs (the same for the CLI, ``check`` and the server).

    ``python``: the interpreter (path, command or virtualenv folder); None picks one
    (``probes.runtime.interpreter``): the project's virtualenv found from the script's folder
    up to ``venv_boundary`` (default: the filesystem root), ``$VIRTUAL_ENV``,
    ``$CONDA_PREFIX``, the tool's own. ``max_memory``: address-space cap of the script's
    process, bytes (status ``out-of-memory`` when it runs out). ``scrub_env``: environment
    variables kept from the script besides ``GRADIENT_DOCTOR_TOKEN`` (the server's secrets).
    """

    python: str | None = None
    venv_boundary: Path | None = None
    max_memory: int | None = None
    scrub_env: frozenset[str] = field(default_factory=frozenset)
