"""Helpers for reading MCP tool results in the server tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def structured(result: Any) -> dict[str, Any]:
    """The structured content of a successful tool result."""
    assert not result.is_error, result.content[0].text
    assert result.structured_content is not None
    return dict(result.structured_content)


def text_of(result: Any) -> str:
    """The first text block of a tool result."""
    return str(result.content[0].text)


def dump(value: Any) -> str:
    """Stable JSON for assertion messages."""
    return json.dumps(value, indent=1, default=str)[:2000]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
