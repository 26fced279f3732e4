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
    moves: list[tuple[cst.CSTNode, cst.CSTNode, bool]] = field(default_factory=list)
    """(statement, anchor, after?) of each move, for the safety checks."""
    inserts: list[tuple[cst.CSTNode, cst.BaseStatement, bool]] = field(default_factory=list)
    """(anchor, new statement, after?) of each insertion of new code."""
    covers: list[cst.CSTNode] = field(default_factory=list)
    """Statements that what this patch moves or inserts must accompany on every path (the
    optimizer steps of every branch, for a ``zero_grad()`` placed after the update)."""

    def move_before(self, stmt: cst.CSTNode, anchor: cst.CSTNode) -> Patch:
        """Move ``stmt`` (a statement) to just before ``anchor`` (a statement)."""
        if not isinstance(stmt, cst.BaseStatement):
            raise TypeError(f"only statements move, not {type(stmt).__name__}")
        self.remove.append(stmt)
        self.before.append((anchor, _without_blank_lines(stmt)))
        self.moves.append((stmt, anchor, False))
        return self

    def move_after(self, stmt: cst.CSTNode, anchor: cst.CSTNode) -> Patch:
        """Move ``stmt`` (a statement) to just after ``anchor`` (a statement)."""
        if not isinstance(stmt, cst.BaseStatement):
            raise TypeError(f"only statements move, not {type(stmt).__name__}")
        self.remove.append(stmt)
        self.after.append((anchor, _without_blank_lines(stmt)))
        self.moves.append((stmt, anchor, True))
        return self

    def insert_before(self, anchor: cst.CSTNode, code: str) -> Patch:
        statement = cst.parse_statement(code)
        self.before.append((anchor, statement))
        self.inserts.append((anchor, statement, False))
        return self

    def insert_after(self, anchor: cst.CSTNode, code: str) -> Patch:
        statement = cst.parse_statement(code)
        self.after.append((anchor, statement))
        self.inserts.append((anchor, statement, True))
        return self

    def wrap_in_if(self, stmt: cst.CSTNode, condition: str) -> Patch:
        """Put the statement ``stmt`` under ``if condition:`` where it is."""
        if not isinstance(stmt, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            raise TypeError(f"only statements are wrapped, not {type(stmt).__name__}")
        inner = stmt.with_changes(leading_lines=[])
        wrapped = cst.If(
            test=cst.parse_expression(condition),
            body=cst.IndentedBlock(body=[inner]),
            leading_lines=stmt.leading_lines,
        )
        self.replace.append((stmt, wrapped))
        self.inserts.append((stmt, wrapped, False))
        return self

    def accompany(self, *statements: cst.CSTNode) -> Patch:
        """What this patch places must run wherever each of ``statements`` runs."""
        self.covers.extend(statements)
        return self

    def replace_node(self, old: cst.CSTNode, new: Replacement) -> Patch:
        """Replace ``old`` by ``new``, or by ``new(updated)`` when ``new`` is a function of the
        node after the edits inside it (so nested patches compose)."""
        self.replace.append((old, new))
        return self

    def changed(self) -> set[int]:
        """ids of the nodes this patch removes or replaces."""
        return {id(n) for n in self.remove} | {id(o) for o, _ in self.replace}

    def anchors(self) -> set[int]:
        """ids of the statements this patch inserts next to."""
        return {id(a) for a, _ in self.before} | {id(a) for a, _ in self.after}

    def touched(self) -> set[int]:
        """ids of every node this patch removes, replaces or anchors on."""
        return self.changed() | self.anchors()

    def conflicts_with(self, other: Patch) -> bool:
        """True when one patch removes or replaces a node the other one touches (two
        insertions next to the same statement do not conflict)."""
        return bool(self.changed() & other.touched() or other.changed() & self.touched())


def combine(patches: Iterable[Patch]) -> Patch:
    """One patch doing all the edits of ``patches`` (which must not conflict)."""
    merged = Patch()
    for patch in patches:
        merged.remove.extend(patch.remove)
        merged.before.extend(patch.before)
        merged.after.extend(patch.after)
        merged.replace.extend(patch.replace)
        merged.moves.extend(patch.moves)
        merged.inserts.extend(patch.inserts)
        merged.covers.extend(patch.covers)
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


CONTEXT = 3


def unified_diff(path: str, old: str, new: str, *, offset: int = 0) -> str:
    """A unified diff from ``old`` to ``new`` with ``a/path`` and ``b/path`` headers.

    ``offset``: ``old`` and ``new`` start at that 0-based line of the file (hunk headers are
    shifted so the diff applies to the whole file).
    """
    name = path.lstrip("/") if path and not path.startswith("<") else "script.py"
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    out: list[str] = []
    for line in difflib.unified_diff(
        old_lines, new_lines, fromfile=f"a/{name}", tofile=f"b/{name}", n=CONTEXT
    ):
        if offset and line.startswith("@@"):
            line = _shift_hunk(line, offset)
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + NO_NEWLINE + "\n")
    return "".join(out)


def _shift_hunk(header: str, offset: int) -> str:
    match = _HUNK.match(header)
    if match is None:
        return header

    def shifted(start: str, length: str | None) -> str:
        value = int(start) + offset
        return f"{value},{length}" if length is not None else f"{value}"

    old = shifted(match.group(1), match.group(2))
    new = shifted(match.group(3), match.group(4))
    return f"@@ -{old} +{new} @@\n"


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


class Patcher:
    """Applies patches to one parsed file quickly: only the top-level statements a patch
    touches are transformed and regenerated; the rest of the text is reused as read."""

    def __init__(self, source: str, module: cst.Module) -> None:
        self.source = source
        self.module = module
        self._owner: dict[int, int] | None = None
        self._spans: list[tuple[int, int]] | None = None
        self._no_trailing_newline = False
        self._layout_ok: bool | None = None

    def _layout(self) -> bool:
        if self._layout_ok is not None:
            return self._layout_ok
        module = self.module
        codes = [module.code_for_node(stmt) for stmt in module.body]
        footer = "".join(module.code_for_node(line) for line in module.footer)
        total = "".join(codes) + footer
        newline = module.default_newline
        if self.source.endswith(total):
            start = len(self.source) - len(total)
        elif (
            total.endswith(newline) and not footer and self.source.endswith(total[: -len(newline)])
        ):
            start = len(self.source) - len(total) + len(newline)
            self._no_trailing_newline = True
        else:
            self._layout_ok = False
            return False
        spans: list[tuple[int, int]] = []
        for code in codes:
            spans.append((start, start + len(code)))
            start += len(code)
        if self._no_trailing_newline and spans:
            last_start, last_end = spans[-1]
            spans[-1] = (last_start, last_end - len(newline))
        self._spans = spans
        owner: dict[int, int] = {}
        from gradient_doctor.probes.static.traverse import walk

        for index, stmt in enumerate(module.body):
            for node in walk(stmt):
                owner[id(node)] = index
        self._owner = owner
        self._layout_ok = True
        return True

    def diff(self, path: str, new: str, region: tuple[int, int]) -> str:
        """The unified diff from the text read to ``new``, a result of :meth:`apply` that
        changed only ``source[start:end]`` (whole lines): only that region and its context
        lines are compared, so the cost does not grow with the file."""
        old = self.source
        start, end = region
        mid_new = new[start : len(new) - (len(old) - end)]
        first = old.count("\n", 0, start)
        last = first + old.count("\n", start, end)
        if end == len(old) and not old.endswith("\n"):
            last += 1
        old_lines = old.splitlines(keepends=True)
        window_start = max(0, first - CONTEXT)
        window_end = min(len(old_lines), last + CONTEXT)
        before = "".join(old_lines[window_start:first])
        after = "".join(old_lines[last:window_end])
        return unified_diff(
            path,
            before + old[start:end] + after,
            before + mid_new + after,
            offset=window_start,
        )

    def top_level_of(self, patch: Patch) -> set[int] | None:
        """Indices of the top-level statements ``patch`` edits (None: edits the module)."""
        if not self._layout():
            return None
        assert self._owner is not None
        top_ids = {id(stmt) for stmt in self.module.body}
        touched = patch.touched()
        if touched & top_ids:
            return None
        indices = {self._owner.get(key, -1) for key in touched}
        if -1 in indices:
            return None
        return indices

    def apply(self, patch: Patch) -> tuple[str, list[str], tuple[int, int]]:
        """The patched text, the regenerated top-level statements (for a syntax check), and
        the range of the text read that changed."""
        indices = self.top_level_of(patch)
        if indices is None:
            code = apply_patch(self.module, patch)
            if self.source.startswith("\ufeff") and not code.startswith("\ufeff"):
                code = "\ufeff" + code
            return code, [code.removeprefix("\ufeff")], (0, len(self.source))
        assert self._spans is not None
        transformer = _PatchTransformer(patch)
        pieces: list[str] = []
        changed: list[str] = []
        cursor = 0
        last_index = len(self.module.body) - 1
        for index in sorted(indices):
            start, end = self._spans[index]
            stmt = self.module.body[index].visit(transformer)
            assert isinstance(stmt, cst.CSTNode)
            code = self.module.code_for_node(stmt)
            if self._no_trailing_newline and index == last_index:
                code = code.removesuffix(self.module.default_newline)
            pieces.append(self.source[cursor:start])
            pieces.append(code)
            changed.append(code)
            cursor = end
        pieces.append(self.source[cursor:])
        first = self._spans[min(indices)][0]
        last = self._spans[max(indices)][1]
        return "".join(pieces), changed, (first, last)
