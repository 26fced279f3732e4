"""Shared helpers for the runtime probe tests."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "runtime"


def fixture(name: str) -> Path:
    """Path of a training script under ``tests/fixtures/runtime``."""
    return FIXTURES / f"{name}.py"
