"""What a static rule is: its catalogue id, its documentation, its examples, its check.

A rule module under ``probes/static/rules/`` defines one subclass of :class:`Rule`; the engine
discovers it. Rules never parse anything themselves: they read the shared training-loop model
(:class:`probes.static.model.FileModel`) and return :class:`RawFinding` objects, which the
engine turns into :class:`probes.findings.Finding` with positions and verified patches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst

from gradient_doctor.knowledge.findings import Severity

if TYPE_CHECKING:
    from gradient_doctor.probes.static.model import FileModel
    from gradient_doctor.probes.static.patches import Patch


@dataclass(frozen=True)
class Invalid:
    """An INVALID example: code and the 1-based line(s) where the rule must report."""

    code: str
    lines: tuple[int, ...]

    def __init__(self, code: str, lines: int | Iterable[int]) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(
            self, "lines", (lines,) if isinstance(lines, int) else tuple(sorted(lines))
        )


@dataclass
class RawFinding:
    """What a rule reports before the engine adds positions and verifies the patch."""

    node: cst.CSTNode
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    patch: Patch | None = None
    fix_description: str | None = None
    fix_safe: bool = True
    severity: Severity | None = None
    """Overrides the rule's severity (e.g. info when the analyser is unsure)."""


class Rule:
    """Base class of the static rules. Subclasses fill the class attributes and ``check``."""

    id: ClassVar[str]
    severity: ClassVar[Severity]
    message: ClassVar[str]
    """Message template; ``{name}`` fields are filled with the user's own names and lines."""
    what: ClassVar[str]
    why: ClassVar[str]
    example: ClassVar[str]
    use_instead: ClassVar[str]
    fix_safety: ClassVar[str]
    snippet_id: ClassVar[str | None] = None
    valid: ClassVar[list[str]] = []
    invalid: ClassVar[list[Invalid]] = []

    def check(self, model: FileModel) -> Iterable[RawFinding]:
        """Yield the problems of this rule found in ``model``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Rule {self.id} ({self.severity})>"
