"""Line and column of selected nodes, computed in one lean code-generation pass.

libcst's ``PositionProvider`` records a position object for every node of the file, which
dominates the analyser's run time. The analyser needs positions only for the few nodes that
findings point at, so this pass tracks line/column while generating code and records ranges
for those nodes alone. Ranges follow ``PositionProvider``'s conventions: 1-based lines,
0-based columns, syntactic bounds (no surrounding parentheses or leading blank lines).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

import libcst as cst
from libcst._nodes.internal import CodegenState


@dataclass(frozen=True)
class Span:
    """Where a node is: 1-based lines, 0-based columns, end exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None


_NULL = _Null()


class _State(CodegenState):
    def __init__(self, module: cst.Module, wanted: set[int]) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.wanted = wanted
        self.line = 1
        self.column = 0
        self.starts: dict[int, list[tuple[int, int]]] = {}
        self.spans: dict[int, Span] = {}

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.column += len(token)

    def add_token(self, value: str) -> None:
        if "\r" in value:
            # "\r\n", "\n" and a lone "\r" each end a line, as in libcst and CPython.
            newlines = value.count("\n") + value.count("\r") - value.count("\r\n")
            last = max(value.rfind("\n"), value.rfind("\r"))
        else:
            newlines = value.count("\n")
            last = value.rfind("\n")
        if newlines:
            self.line += newlines
            self.column = len(value) - last - 1
        else:
            self.column += len(value)

    def pop_trailing_newline(self) -> None:
        # Nothing is kept, so nothing to pop: positions before the end are unaffected.
        return None

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            self.starts.setdefault(id(node), []).append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.wanted:
            line, column = self.starts[key].pop()
            self.spans.setdefault(key, Span(line, column, self.line, self.column))

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _Null | _Recorder:
        if id(node) not in self.wanted:
            return _NULL
        return _Recorder(self, id(node))


class _Recorder:
    def __init__(self, state: _State, key: int) -> None:
        self.state = state
        self.key = key
        self.start = (0, 0)

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        line, column = self.start
        self.state.spans[self.key] = Span(line, column, self.state.line, self.state.column)


def spans_of(
    module: cst.Module,
    nodes: Iterable[cst.CSTNode],
    *,
    top_level: dict[int, int] | None = None,
    tree: ast.Module | None = None,
    first_lines: list[int] | None = None,
) -> dict[int, Span]:
    """Spans of ``nodes`` (keyed by ``id(node)``) in ``module``.

    With ``top_level`` (node id → index of its top-level statement) and the file's ``ast``
    tree, only the top-level statements that hold the nodes are generated, each starting at
    the line CPython's parser gives it; otherwise the whole module is.
    """
    wanted = {id(node) for node in nodes}
    if not wanted:
        return {}
    state = _State(module, wanted)
    starts = None
    if top_level:
        if first_lines is not None:
            starts = _starts(module, first_lines)
        elif tree is not None:
            starts = statement_lines(module, tree)
    if starts is None or top_level is None or any(key not in top_level for key in wanted):
        module._codegen(state)
        return state.spans
    for index in sorted({top_level[key] for key in wanted}):
        state.line = starts[index]
        state.column = 0
        module.body[index]._codegen(state)
    return state.spans


def statement_lines(module: cst.Module, tree: ast.Module) -> list[int] | None:
    """The 1-based line where each top-level statement's code starts (its leading blank and
    comment lines included), from CPython's positions; None if the two trees disagree."""
    return _starts(module, first_lines(tree))


def first_lines(tree: ast.Module) -> list[int]:
    """The first line of each top-level statement of CPython's tree (decorators included)."""
    out: list[int] = []
    for node in tree.body:
        first = node.lineno
        decorators = getattr(node, "decorator_list", None)
        if decorators:
            first = min(first, *(d.lineno for d in decorators))
        out.append(first)
    return out


def _starts(module: cst.Module, lines: list[int]) -> list[int] | None:
    starts: list[int] = []
    index = 0
    for statement in module.body:
        count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        if index + count > len(lines):
            return None
        first = lines[index]
        index += count
        starts.append(first - len(statement.leading_lines))
    return starts if index == len(lines) else None
