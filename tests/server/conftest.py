"""Shared fixtures of the server tests: a scratch root with copies of the example scripts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from server_helpers import EXAMPLES, FIXTURES


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A directory holding copies of the bundled examples and the test scripts."""
    root = tmp_path / "project"
    root.mkdir()
    for script in [*EXAMPLES.glob("*.py"), *FIXTURES.glob("*.py")]:
        shutil.copy(script, root / script.name)
    return root
