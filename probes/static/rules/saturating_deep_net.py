"""saturating-deep-net: a deep stack (> 20) of sigmoid/tanh layers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.names import dotted_name, number_value
from gradient_doctor.probes.static.traverse import calls_in, walk

DEPTH_LIMIT = 20
SATURATING = frozenset({"Sigmoid", "Tanh", "sigmoid", "tanh", "Hardtanh", "Softsign"})


class SaturatingDeepNet(Rule):
    id = "saturating-deep-net"
    severity = "warning"
    message = (
        "line {line} builds {depth} repeated `{activation}` layers: gradients shrink at every "
        "saturating activation and vanish long before they reach the first layers"
    )
    what = "Finds networks that stack more than 20 sigmoid or tanh activations."
    why = (
        "The derivative of sigmoid is at most 0.25 and tanh's at most 1 (much less once "
        "saturated). Chained over more than 20 layers the product is vanishingly small, so the "
        "early layers barely learn. Use ReLU/GELU, residual connections and normalisation."
    )
    example = (
        "layers = []\n"
        "for _ in range(30):\n"
        "    layers += [nn.Linear(256, 256), nn.Sigmoid()]\n"
        "model = nn.Sequential(*layers)\n"
    )
    use_instead = (
        "layers = []\n"
        "for _ in range(30):\n"
        "    layers += [nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()]\n"
        "model = nn.Sequential(*layers)\n"
    )
    fix_safety = "No automatic fix: changing activations changes the model; see vanishing-fixes."
    snippet_id = "vanishing-fixes"
    valid: ClassVar[list[str]] = [
        """
import torch.nn as nn
layers = []
for _ in range(30):
    layers += [nn.Linear(256, 256), nn.ReLU()]
model = nn.Sequential(*layers)
""",
        """
import torch.nn as nn
model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(4)])
""",
        """
import torch.nn as nn
model = nn.Sequential(*([nn.Linear(64, 64), nn.Tanh()] * 3))
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch.nn as nn
layers = []
for _ in range(30):
    layers.append(nn.Linear(256, 256))
    layers.append(nn.Sigmoid())
model = nn.Sequential(*layers)
""",
            6,
        ),
        Invalid(
            """
import torch.nn as nn
DEPTH = 50
model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(DEPTH)])
""",
            4,
        ),
        Invalid(
            """
import torch.nn as nn
blocks = [nn.Linear(64, 64), nn.Tanh()] * 25
model = nn.Sequential(*blocks)
""",
            3,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        seen: set[int] = set()
        for loop in model.for_loops:
            depth = _depth(model, loop.iter)
            if depth is None or depth <= DEPTH_LIMIT:
                continue
            act, normalised = _activations_in(loop.body)
            if act is None or normalised:
                continue
            stmt = _statement_with(loop.body, act)
            if stmt is not None and id(stmt) not in seen:
                seen.add(id(stmt))
                yield self._finding(stmt, depth, act)
        for repeat, stmt in model.list_repeats:
            # `[nn.Linear(d, d), nn.Sigmoid()] * 30`: the list's layers, K times over.
            listed, times = (
                (repeat.left, repeat.right)
                if isinstance(repeat.left, cst.List)
                else (repeat.right, repeat.left)
            )
            depth = _count(model, times)
            if depth is None or depth <= DEPTH_LIMIT:
                continue
            act, normalised = _activations_in(listed)
            if act is None or normalised:
                continue
            node = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else stmt
            if id(node) not in seen:
                seen.add(id(node))
                yield self._finding(node, depth, act)
        for comp, stmt in model.comprehensions:
            depth = _comprehension_depth(model, comp.for_in)
            if depth is None or depth <= DEPTH_LIMIT:
                continue
            act, normalised = _activations_in(comp)
            if act is None or normalised:
                continue
            node = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else stmt
            if id(node) not in seen:
                seen.add(id(node))
                yield self._finding(node, depth, act)

    def _finding(self, node: cst.CSTNode, depth: int, activation: str) -> RawFinding:
        return RawFinding(
            node=node,
            message=self.message,
            evidence={"line": node, "depth": depth, "activation": activation},
        )


def _activation(call: cst.Call) -> str | None:
    name = dotted_name(call.func)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    return last if last in SATURATING else None


def _activations_in(node: cst.CSTNode) -> tuple[str | None, bool]:
    """The first saturating activation under ``node`` and whether a norm layer is there too."""
    first: str | None = None
    normalised = False
    for call in calls_in(node):
        act = _activation(call)
        if act is not None and first is None:
            first = act
        name = dotted_name(call.func) or ""
        if "Norm" in name.rsplit(".", 1)[-1]:
            normalised = True
    return first, normalised


def _depth(model: FileModel, iterable: cst.BaseExpression) -> int | None:
    """``K`` for ``range(K)`` with ``K`` a literal or a constant of the file."""
    if not isinstance(iterable, cst.Call) or dotted_name(iterable.func) != "range":
        return None
    args = [a for a in iterable.args if a.keyword is None]
    if len(args) != 1:
        return None
    return _count(model, args[0].value)


def _count(model: FileModel, value: cst.BaseExpression) -> int | None:
    """``value`` as a whole number: a literal or a constant of the file."""
    number = number_value(value)
    if number is None and isinstance(value, cst.Name):
        constant = model.constants.get(value.value)
        number = number_value(constant) if constant is not None else None
    return int(number) if number is not None else None


def _comprehension_depth(model: FileModel, clause: cst.CompFor) -> int | None:
    """The largest ``range(K)`` among the ``for`` clauses of a comprehension."""
    depths: list[int] = []
    current: cst.CompFor | None = clause
    while current is not None:
        depth = _depth(model, current.iter)
        if depth is not None:
            depths.append(depth)
        current = current.inner_for_in
    return max(depths) if depths else None


def _statement_with(body: cst.BaseSuite, activation: str) -> cst.CSTNode | None:
    for node in walk(body, prune=lambda n: isinstance(n, cst.SimpleStatementLine)):
        if isinstance(node, cst.SimpleStatementLine):
            act, _ = _activations_in(node)
            if act == activation:
                return node.body[0]
    return None
