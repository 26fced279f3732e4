"""Apply the static analyser's unified diffs to the text that was read (in memory only).

The analyser's diffs are written against the exact text it read, so a hunk must match that
text line for line; no fuzz, since a patch applied to lines it was not written for is worse than
none. The patches of several findings are applied one after the other: each is written against
the original text, so a hunk may land a few lines away from where its header says (the lines
an earlier patch added or removed) but its context must still match exactly.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gradient_doctor.knowledge.findings import Finding

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """A diff that cannot be applied to the text: one line saying where and why."""


@dataclass
class _Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


def _split_newlines(text: str) -> list[str]:
    """Lines with their ends, split at "\\n" only (``str.splitlines`` also splits at form
    feeds and other separators that Python source may hold inside a line)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return lines + ([parts[-1]] if parts[-1] else [])


def _hunks(diff: str) -> list[_Hunk]:
    hunks: list[_Hunk] = []
    current: _Hunk | None = None
    last_tag = ""
    for line in _split_newlines(diff):
        if line.startswith(("--- ", "+++ ")) and current is None:
            continue
        match = _HUNK.match(line)
        if match:
            current = _Hunk(old_start=int(match.group(1)))
            hunks.append(current)
            continue
        if current is None:
            continue
        if line.startswith("\\"):
            # "\ No newline at end of file": the line before it has no line end.
            touched = {" ": (current.old, current.new), "-": (current.old,), "+": (current.new,)}
            for side in touched.get(last_tag, ()):
                if side:
                    side[-1] = side[-1].rstrip("\r\n")
            continue
        tag, body = line[:1], line[1:]
        if tag == " ":
            current.old.append(body)
            current.new.append(body)
        elif tag == "-":
            current.old.append(body)
        elif tag == "+":
            current.new.append(body)
        elif line.strip() == "":
            # An empty context line whose leading space was stripped (editors, e-mail).
            tag = " "
            current.old.append("\n")
            current.new.append("\n")
        else:
            raise PatchError(f"not a unified diff line: {line.rstrip()[:80]!r}")
        last_tag = tag
    return hunks


def _find(lines: Sequence[str], wanted: Sequence[str], near: int, start: int) -> int | None:
    """The index at or after ``start`` where ``wanted`` matches, the closest to ``near``."""
    if not wanted:
        return max(start, min(near, len(lines)))
    size = len(wanted)
    best: int | None = None
    for index in range(start, len(lines) - size + 1):
        if lines[index : index + size] == list(wanted) and (
            best is None or abs(index - near) < abs(best - near)
        ):
            best = index
    return best


def apply_diff(text: str, diff: str) -> str:
    """``text`` with the unified ``diff`` applied; :class:`PatchError` if a hunk does not
    match the text exactly (at its own line or shifted by earlier edits)."""
    hunks = _hunks(diff)
    if not hunks:
        raise PatchError("the patch has no hunks")
    lines = _split_newlines(text)
    out: list[str] = []
    cursor = 0  # lines[:cursor] are already copied to out (possibly edited)
    for hunk in hunks:
        near = hunk.old_start - 1 if hunk.old else hunk.old_start
        found = _find(lines, hunk.old, near, cursor)
        if found is None:
            first = next((line.strip() for line in hunk.old if line.strip()), "")
            raise PatchError(
                f"the hunk at line {hunk.old_start} does not match the script's text"
                + (f" (around {first[:60]!r})" if first else "")
            )
        out.extend(lines[cursor:found])
        out.extend(hunk.new)
        cursor = found + len(hunk.old)
    out.extend(lines[cursor:])
    return "".join(out)


def unified_diff(before: str, after: str, path: str) -> str:
    """A unified diff from ``before`` to ``after`` with ``a/PATH`` / ``b/PATH`` headers."""
    name = path.lstrip("/")
    return "".join(
        difflib.unified_diff(
            _split_newlines(before),
            _split_newlines(after),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )


@dataclass
class ChosenPatch:
    """The patch a verification applies and the findings it claims to fix."""

    #: The diffs applied one after the other: the combined patch alone, or one per finding.
    diffs: list[str]
    targets: list[str]
    #: The analyser's combined patch is what runs (not a choice of findings).
    combined: bool = False
    #: Why there is nothing to apply (status ``no-patch``), when ``diffs`` is empty.
    reason: str | None = None


def patchable(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    """Static findings that carry a diff, by id (several findings may share an id)."""
    found: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.fix is not None and finding.fix.diff:
            found.setdefault(finding.id, []).append(finding)
    return found


def choose_patch(
    findings: Sequence[Finding],
    combined_diff: str | None,
    ids: Sequence[str] | None = None,
    unmerged: Sequence[str] = (),
) -> ChosenPatch:
    """The patch to verify: the combined patch (``ids`` None), or the patches of the findings
    with the given ``ids`` only, applied in file order.

    An id with no patch is a :class:`ValueError` naming the ids that have one; no finding with
    a patch at all is a :class:`ChosenPatch` with no diff (status ``no-patch``). ``unmerged``:
    ids whose diff the analyser left out of the combined patch (it overlaps another), which the
    combined patch therefore does not target.
    """
    offered = patchable(findings)
    if ids is None:
        targets = [i for i in offered if i not in unmerged]
        if combined_diff and targets:
            return ChosenPatch(diffs=[combined_diff], targets=targets, combined=True)
        return ChosenPatch(diffs=[], targets=[], reason="no finding comes with a patch")
    wanted = list(dict.fromkeys(i.strip() for i in ids if i.strip()))
    if not wanted:
        raise ValueError("no finding id given to verify")
    unknown = [i for i in wanted if i not in offered]
    if unknown:
        have = ", ".join(sorted(offered)) or "none"
        raise ValueError(
            f"no patch for {', '.join(unknown)} in this script (findings with a patch: {have})"
        )
    if combined_diff and set(wanted) == {i for i in offered if i not in unmerged}:
        return ChosenPatch(diffs=[combined_diff], targets=wanted, combined=True)
    chosen = [f for i in wanted for f in offered[i]]
    chosen.sort(key=lambda f: (f.line or 0, f.col or 0))
    return ChosenPatch(
        diffs=[f.fix.diff for f in chosen if f.fix is not None and f.fix.diff], targets=wanted
    )


def apply_chosen(text: str, chosen: ChosenPatch) -> str:
    """``text`` with every diff of ``chosen`` applied in turn; a :class:`PatchError` names the
    diffs that overlap (each is written against the original text)."""
    patched = text
    for number, diff in enumerate(chosen.diffs):
        try:
            patched = apply_diff(patched, diff)
        except PatchError as exc:
            if number == 0:
                raise
            raise PatchError(
                f"{exc}: the patches of {', '.join(chosen.targets)} overlap; verify them "
                "together (the combined patch) or one at a time"
            ) from None
    return patched
