"""Shared paths of the log tests: the fixtures made by tests/fixtures/logs/make_logs.py."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
