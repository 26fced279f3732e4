"""The one folder Gradient Doctor caches in (the matcher's index, the server's ``initialize``).

Kept apart from the matcher so the MCP server's fast start can find it without importing the
knowledge base.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path | None:
    """``$GRADIENT_DOCTOR_CACHE_DIR`` (set but empty: caching off, returns None), else
    ``$XDG_CACHE_HOME/gradient-doctor``, else ``~/.cache/gradient-doctor``."""
    configured = os.environ.get("GRADIENT_DOCTOR_CACHE_DIR")
    if configured is not None:
        return Path(configured) if configured.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradient-doctor"
