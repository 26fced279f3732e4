"""Patches as libcst edits: move, insert, remove and replace statements or expressions.

A :class:`Patch` names the nodes it touches by identity in the parsed module, so several
patches can be checked for conflicts and applied together. Applying keeps every untouched
byte of the file (libcst round-trips the source exactly); moved statements keep their own
comments and are re-indented by the block they land in.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst

Replacement = cst.CSTNode | Callable[[cst.CSTNode], cst.CSTNode]


@dataclass
class Patch:
    """Edits to one module, keyed by node identity."""

    remove: list[cst.CSTNode] = field(default_factory=list)
    before: list[tuple[cst.CSTNode, cst.BaseStatement]] = field(default_factory=list)
    after: list[tuple[cst.CSTNode, cst.BaseStatement]] = field(default_factory=list)
    replace: list[tuple[cst.CSTNode, Replacement]] = field(default_factory=list)

    def move_before(self, stmt: cst.BaseStatement, anchor: cst.CSTNode) -> Patch:
        """Move ``stmt`` to just before ``anchor`` (a statement)."""
        self.remove.append(stmt)
        self.before.append((anchor, _without_blank_lines(stmt)))
        return self

    def move_after(self, stmt: cst.BaseStatement, anchor: cst.CSTNode) -> Patch:
        """Move ``stmt`` to just after ``anchor`` (a statement)."""
        self.remove.append(stmt)
        self.after.append((anchor, _without_blank_lines(stmt)))
        return self

    def insert_before(self, anchor: cst.CSTNode, code: str) -> Patch:
        self.before.append((anchor, cst.parse_statement(code)))
        return self

    def insert_after(self, anchor: cst.CSTNode, code: str) -> Patch:
        self.after.append((anchor, cst.parse_statement(code)))
        return self

    def replace_node(self, old: cst.CSTNode, new: Replacement) -> Patch:
        """Replace ``old`` by ``new``, or by ``new(updated)`` when ``new`` is a function of the
        node after the edits inside it (so nested patches compose)."""
        self.replace.append((old, new))
        return self

    def touched(self) -> set[int]:
        """ids of every node this patch removes, replaces or anchors on."""
        ids = {id(n) for n in self.remove}
        ids |= {id(a) for a, _ in self.before}
        ids |= {id(a) for a, _ in self.after}
        ids |= {id(o) for o, _ in self.replace}
        return ids

    def conflicts_with(self, other: Patch) -> bool:
        return bool(self.touched() & other.touched())


def combine(patches: Iterable[Patch]) -> Patch:
    """One patch doing all the edits of ``patches`` (which must not conflict)."""
    merged = Patch()
    for patch in patches:
        merged.remove.extend(patch.remove)
        merged.before.extend(patch.before)
        merged.after.extend(patch.after)
        merged.replace.extend(patch.replace)
    return merged


def apply_patch(module: cst.Module, patch: Patch) -> str:
    """The source of ``module`` with ``patch`` applied."""
    return module.visit(_PatchTransformer(patch)).code


def _without_blank_lines(stmt: cst.BaseStatement) -> cst.BaseStatement:
    # The blank lines above a moved statement belong to where it was, not where it goes.
    if not isinstance(stmt, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        return stmt
    lines = [line for line in stmt.leading_lines if line.comment is not None]
    return stmt.with_changes(leading_lines=lines)


class _PatchTransformer(cst.CSTTransformer):
    def __init__(self, patch: Patch) -> None:
        super().__init__()
        self.removed = {id(n) for n in patch.remove}
        self.before: dict[int, list[cst.BaseStatement]] = {}
        self.after: dict[int, list[cst.BaseStatement]] = {}
        for anchor, stmt in patch.before:
            self.before.setdefault(id(anchor), []).append(stmt)
        for anchor, stmt in patch.after:
            self.after.setdefault(id(anchor), []).append(stmt)
        self.replacements = {id(old): new for old, new in patch.replace}

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        replacement = self.replacements.get(id(original_node))
        if replacement is not None:
            if isinstance(replacement, cst.CSTNode):
                return replacement
            return replacement(updated_node)
        if isinstance(original_node, cst.IndentedBlock) and isinstance(
            updated_node, cst.IndentedBlock
        ):
            body = self._rebuild(original_node.body, updated_node.body)
            if not body:
                body = [cst.SimpleStatementLine([cst.Pass()])]
            return updated_node.with_changes(body=body)
        if isinstance(original_node, cst.Module) and isinstance(updated_node, cst.Module):
            return updated_node.with_changes(
                body=self._rebuild(original_node.body, updated_node.body)
            )
        return updated_node

    def _rebuild(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        body: list[cst.BaseStatement] = []
        for old, new in zip(original, updated, strict=True):
            body.extend(self.before.get(id(old), []))
            if id(old) not in self.removed:
                body.append(new)
            body.extend(self.after.get(id(old), []))
        return body


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"


def unified_diff(path: str, old: str, new: str) -> str:
    """A unified diff from ``old`` to ``new`` with ``a/path`` and ``b/path`` headers."""
    name = path.lstrip("/") if path and not path.startswith("<") else "script.py"
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    out: list[str] = []
    for line in difflib.unified_diff(
        old_lines, new_lines, fromfile=f"a/{name}", tofile=f"b/{name}", n=3
    ):
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + NO_NEWLINE + "\n")
    return "".join(out)


class DiffError(ValueError):
    """The diff does not apply to the text."""


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a unified diff made by :func:`unified_diff` to ``text``; strict context check."""
    source = text.splitlines(keepends=True)
    result: list[str] = []
    cursor = 0
    lines = diff.splitlines(keepends=True)
    index = 0
    while index < len(lines) and not lines[index].startswith("@@"):
        index += 1
    while index < len(lines):
        header = _HUNK.match(lines[index])
        if header is None:
            raise DiffError(f"bad hunk header: {lines[index]!r}")
        start = int(header.group(1))
        old_start = start - 1 if header.group(2) != "0" else start
        if old_start < cursor:
            raise DiffError("overlapping hunks")
        result.extend(source[cursor:old_start])
        cursor = old_start
        index += 1
        while index < len(lines) and not lines[index].startswith("@@"):
            line = lines[index]
            tag, body = line[:1], line[1:]
            if index + 1 < len(lines) and lines[index + 1].rstrip("\n") == NO_NEWLINE:
                body = body[:-1] if body.endswith("\n") else body
                index += 1
            if tag in {" ", "-"}:
                if cursor >= len(source) or source[cursor] != body:
                    raise DiffError(f"context mismatch at line {cursor + 1}")
                cursor += 1
                if tag == " ":
                    result.append(body)
            elif tag == "+":
                result.append(body)
            else:
                raise DiffError(f"unexpected diff line: {line!r}")
            index += 1
    result.extend(source[cursor:])
    return "".join(result)
