"""Paths and small helpers of the verification tests (not a conftest: tests/server has one)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUNTIME_FIXTURES = REPO / "tests" / "fixtures" / "runtime"
VERIFY_FIXTURES = REPO / "tests" / "fixtures" / "verify"
EXAMPLES = REPO / "examples"
BROKEN_PATCH_CLI = Path(__file__).resolve().parent / "broken_patch_cli.py"
#: Few steps keep the suite short; every fixture shows its bug within them.
STEPS = "8"


def folder_state(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path → sha256): what a run must leave as it was."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def run_gd(
    *args: str, cwd: Path | None = None, wrapper: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gradient-doctor ARGS`` in a fresh interpreter (``wrapper``: a test-only entry point
    that injects something first, e.g. a broken patch)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    entry = wrapper if wrapper is not None else ["-m", "gradient_doctor.skill_server"]
    return subprocess.run(
        [sys.executable, *entry, *args],
        cwd=cwd or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def verification_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``verification`` object of a ``check --verify --format json`` run."""
    assert result.returncode in (0, 1), result.stderr[-2000:]
    data = json.loads(result.stdout)
    assert data["verification"] is not None, result.stdout[-2000:]
    return dict(data["verification"])
