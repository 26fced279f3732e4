"""Shared fixtures of the server tests: a scratch root with copies of the example scripts."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# tests/knowledge and tests/templates (folders without __init__.py) would otherwise shadow the
# real packages as namespace packages once pytest puts tests/ on sys.path.
if str(REPO) not in sys.path[:1]:
    sys.path.insert(0, str(REPO))

from server_helpers import EXAMPLES, FIXTURES  # noqa: E402


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A directory holding copies of the bundled examples and the test scripts."""
    root = tmp_path / "project"
    root.mkdir()
    for script in [*EXAMPLES.glob("*.py"), *FIXTURES.glob("*.py")]:
        shutil.copy(script, root / script.name)
    return root
