"""Fast read-only traversal of libcst trees.

libcst's ``node.visit(visitor)`` rebuilds every node it passes through, which costs several
times more than reading the tree. The analyser only reads, so it walks the dataclass fields
directly, skipping whitespace and punctuation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import libcst as cst

_SKIPPED_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "header",
        "footer",
        "trailing_whitespace",
        "comma",
        "semicolon",
        "equal",
        "colon",
        "dot",
        "operator",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "asynchronous",
        "newline",
        "default_indent",
        "default_newline",
        "encoding",
        "indent",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in _SKIPPED_FIELDS and not f.name.startswith("whitespace")
        )
        _FIELDS[cls] = names
    return names


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of ``node`` that carry code (no whitespace or punctuation)."""
    out: list[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            out.append(value)
        elif isinstance(value, tuple | list):
            out.extend(v for v in value if isinstance(v, cst.CSTNode))
    return out


def walk(
    node: cst.CSTNode, prune: Callable[[cst.CSTNode], bool] | None = None
) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), in source order.

    ``prune(n)`` returning True yields ``n`` but not its descendants.
    """
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if prune is not None and prune(current):
            continue
        kids = children(current)
        kids.reverse()
        stack.extend(kids)


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call under ``node``, outer calls first."""
    return [n for n in walk(node) if isinstance(n, cst.Call)]
