"""Helpers shared by the static-analyser I/O tests: fixture discovery and a strict diff applier.

The diff applier is written here, independently of the engine's own patch code, so that the
fixture tests check the engine's diffs against a second implementation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
GOLDEN = FIXTURES / "golden"
BUGGY = FIXTURES / "buggy"
SHAPES_GOLDEN = FIXTURES / "shapes" / "golden"
SHAPES_BUGGY = FIXTURES / "shapes" / "buggy"
"""Shapes learnt from real code (framework-managed loops, split and branched loops, loss
provenance): the analyser's own corpus, kept apart from buggy/ and golden/, which the
knowledge matcher's light code rules are also measured on."""

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Fixture:
    path: Path
    description: str
    style: str
    expected: list[dict[str, Any]]
    allowed_info: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem


def load_fixtures(folder: Path) -> list[Fixture]:
    """Every ``*.py`` fixture in ``folder`` with its ``*.expected.json``."""
    found = []
    for script in sorted(folder.glob("*.py")):
        data = json.loads(script.with_suffix(".expected.json").read_text(encoding="utf-8"))
        found.append(
            Fixture(
                path=script,
                description=data["description"],
                style=data["style"],
                expected=data["expected"],
                allowed_info=data.get("allowed_info", []),
            )
        )
    return found


class PatchError(ValueError):
    """The diff does not apply to the text exactly."""


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a unified diff to ``text`` exactly (no fuzz, no offset); PatchError otherwise."""
    old = text.splitlines(keepends=True)
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    result: list[str] = []
    cursor = 0  # index into old of the next line not yet copied
    i = 0
    saw_hunk = False
    while i < len(lines):
        header = _HUNK.match(lines[i])
        i += 1
        if not header:
            if saw_hunk and not lines[i - 1].startswith(("--- ", "+++ ")):
                raise PatchError(f"unexpected line outside a hunk: {lines[i - 1]!r}")
            continue
        saw_hunk = True
        old_start, old_count = int(header.group(1)), int(header.group(2) or 1)
        new_count = int(header.group(4) or 1)
        start = old_start - 1 if old_count else old_start
        if start < cursor:
            raise PatchError("hunks overlap or are out of order")
        result.extend(old[cursor:start])
        cursor = start
        taken_old = taken_new = 0
        last_added: int | None = None
        while taken_old < old_count or taken_new < new_count:
            if i >= len(lines):
                raise PatchError("diff ends inside a hunk")
            line = lines[i]
            i += 1
            tag, body = line[:1], line[1:]
            if tag in (" ", "-", ""):
                if cursor >= len(old):
                    raise PatchError("hunk runs past the end of the file")
                if old[cursor].rstrip("\n") != body:
                    raise PatchError(
                        f"line {cursor + 1} is {old[cursor]!r}, the diff expects {body!r}"
                    )
                if tag != "-":
                    result.append(old[cursor])
                cursor += 1
                taken_old += 1
                if tag != "-":
                    taken_new += 1
                last_added = None
            elif tag == "+":
                result.append(body + "\n")
                last_added = len(result) - 1
                taken_new += 1
            else:
                raise PatchError(f"bad hunk line {line!r}")
            if i < len(lines) and lines[i].startswith("\\"):
                i += 1
                if last_added is not None:  # the added line has no final newline
                    result[last_added] = result[last_added][:-1]
                elif result and result[-1].endswith("\n") and tag != "-":
                    result[-1] = result[-1][:-1]
    result.extend(old[cursor:])
    if not saw_hunk:
        raise PatchError("no hunk in the diff")
    return "".join(result)
