"""Shared test helpers: run the real CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A static rule that raises must fail the tests, not vanish silently as it does for users
# (engine.RAISE_RULE_ERRORS_ENV); the CLI subprocesses inherit it.
os.environ.setdefault("GRADIENT_DOCTOR_RAISE_RULE_ERRORS", "1")


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``gradient-doctor ARGS`` exactly as a user would (a fresh interpreter)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [sys.executable, "-m", "gradient_doctor.skill_server", *args],
        cwd=cwd or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
