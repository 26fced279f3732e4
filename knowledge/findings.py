"""The one finding type shared by the static analyser and the runtime probe.

A finding is keyed by a catalogue identifier (``../shared/catalog.md``), carries a severity,
where it was seen (a file position for static findings, a step / parameter / module for
runtime ones), the numbers that support it, a message naming the user's own code, and an
optional fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["critical", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
FindingOrigin = Literal["static", "runtime", "text"]


def severity_at_least(severity: str, threshold: str) -> bool:
    """True when ``severity`` is as serious as ``threshold`` or more."""
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[threshold]


class Fix(BaseModel):
    """A proposed change. ``diff`` is a unified diff against the exact text that was read."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(description="What the fix does, in one sentence.")
    diff: str | None = Field(default=None, description="Unified diff against the text read.")
    safe: bool = Field(
        default=True,
        description="False when applying the fix can change training behaviour beyond the bug.",
    )
    snippet_id: str | None = Field(default=None, description="Fix snippet in templates/.")


class Finding(BaseModel):
    """One problem found by a probe, keyed by a catalogue id."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Catalogue identifier, e.g. 'clip-after-step'.")
    severity: Severity
    message: str
    origin: FindingOrigin = "static"
    path: str | None = None
    line: int | None = Field(default=None, description="1-based line of the offending call.")
    col: int | None = Field(default=None, description="1-based column of the offending call.")
    end_line: int | None = None
    end_col: int | None = None
    step: int | None = Field(default=None, description="Optimizer step (runtime findings).")
    parameter: str | None = None
    module: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    fix: Fix | None = None


def evidence_number(value: float | None) -> float | str | None:
    """A number for a finding's evidence: 6 significant digits, non-finite values as strings
    (``"nan"``, ``"inf"``, ``"-inf"``) so the evidence stays valid JSON."""
    if value is None:
        return None
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.6g}")
