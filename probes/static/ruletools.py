"""Queries over the training-loop model that several rules share."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

import libcst as cst

from gradient_doctor.probes.static.model import (
    Accumulation,
    Event,
    FileModel,
    FuncInfo,
    Unit,
    exclusive,
)
from gradient_doctor.probes.static.names import code_of, method_name, number_value, parenthesize
from gradient_doctor.probes.static.traverse import children, walk

TENSOR_METHODS = frozenset(
    {
        "mean",
        "sum",
        "float",
        "double",
        "half",
        "bfloat16",
        "squeeze",
        "view",
        "reshape",
        "to",
        "cuda",
        "contiguous",
        "clone",
        "get",
        "nanmean",
    }
)
SCALING_METHODS = frozenset({"div", "mul", "div_", "mul_", "true_divide", "multiply", "divide"})


def movable(stmt: cst.CSTNode) -> bool:
    """A one-statement line that a patch can move or remove on its own."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1


class Placement(NamedTuple):
    """Where an event shows in the function that also holds another event."""

    node: cst.CSTNode
    """The event's call, or the call of the helper function that contains it."""
    stmt: cst.CSTNode
    """The statement holding ``node``: what a patch moves or removes."""
    via_helper: bool

    @property
    def standalone(self) -> bool:
        """A one-statement line of its own (not a helper call): safe to move or remove."""
        return not self.via_helper and movable(self.stmt)


def placement(event: Event, other: Event) -> Placement:
    """``event`` as it appears in the function that also holds ``other``."""
    return Placement(*event.relative_to(other))


def placements(event: Event, other: Event) -> tuple[Placement, Placement]:
    """``event`` and ``other`` as they appear in the one function that holds both."""
    return placement(event, other), placement(other, event)


class AccumulatingUnit(NamedTuple):
    """A unit that accumulates gradients, with the optimizer steps that run on the update."""

    unit: Unit
    accumulation: Accumulation
    steps: list[Event]
    """The unit's steps that run only on the update (never empty), in source order."""


def accumulating_units(
    model: FileModel, *, skip_deepspeed: bool = False
) -> Iterator[AccumulatingUnit]:
    """The units of ``model`` that accumulate gradients and step on the update.

    ``skip_deepspeed`` leaves out units stepped by a DeepSpeed engine, whose ``step()``
    zeroes the gradients and divides the loss by the accumulation count itself.
    """
    for whole in model.units:
        for unit in [whole] if whole.accumulation is not None else whole.variants:
            accumulation = unit.accumulation
            if accumulation is None:
                continue
            steps = [s for s in unit.steps if unit.gated(s)]
            if not steps:
                continue
            if unit.backwards and all(
                unit.gated(b) and not unit.in_micro_step(b) for b in unit.backwards
            ):
                # Every backward runs with the step, under its condition (a step on every
                # N-th batch, the others forward-only): no gradient accumulates, so nothing
                # else in the loop runs "per micro-batch".
                continue
            if skip_deepspeed and any(s.framework == "deepspeed" for s in steps):
                continue
            yield AccumulatingUnit(unit, accumulation, steps)


def micro_step_backwards(unit: Unit) -> list[Event]:
    """The unit's plain ``backward()`` calls (no framework's) that run on every micro-batch."""
    return [b for b in unit.backwards if b.framework is None and unit.in_micro_step(b)]


def micro_step_for(unit: Unit) -> cst.For | None:
    """The ``for`` statement of the unit's micro-step loop (None: no loop, or another kind)."""
    loop = unit.micro.node if unit.micro is not None else None
    return loop if isinstance(loop, cst.For) else None


def clipping(unit: Unit) -> list[Event]:
    """The unit's clipping calls that change the gradients (an infinite limit only measures)."""
    return [clip for clip in unit.of_kind("clip") if not clip.measures_only]


def direct_clip_calls(
    model: FileModel, clip_kind: Literal["norm", "value"]
) -> Iterator[tuple[Event, cst.Call]]:
    """Every ``clip_kind`` clipping call of the file, where it is written (helpers not inlined)."""
    for event in model.direct_events():
        # Clip events are always recorded on a call; the isinstance check narrows the type.
        if (
            event.kind == "clip"
            and event.clip_kind == clip_kind
            and isinstance(event.call, cst.Call)
        ):
            yield event, event.call


def previous(unit: Unit, event: Event, kinds: Iterable[str]) -> Event | None:
    """The nearest event of ``kinds`` before ``event`` that can run in the same pass."""
    wanted = set(kinds)
    for other in reversed(unit.events[: _index(unit, event)]):
        if other.kind in wanted and not exclusive(other, event):
            return other
    return None


def following(unit: Unit, event: Event, kinds: Iterable[str]) -> Event | None:
    """The nearest event of ``kinds`` after ``event`` that can run in the same pass."""
    wanted = set(kinds)
    for other in unit.events[_index(unit, event) + 1 :]:
        if other.kind in wanted and not exclusive(other, event):
            return other
    return None


def between(unit: Unit, first: Event, last: Event, kinds: Iterable[str]) -> list[Event]:
    """Events of ``kinds`` strictly between ``first`` and ``last`` (same pass as ``last``)."""
    wanted = set(kinds)
    start, end = _index(unit, first), _index(unit, last)
    return [
        e
        for e in unit.events[start + 1 : end]
        if e.kind in wanted and not exclusive(e, last) and not exclusive(e, first)
    ]


def _index(unit: Unit, event: Event) -> int:
    for index, other in enumerate(unit.events):
        if other is event:
            return index
    return len(unit.events)


def label(node: cst.CSTNode) -> str:
    """``optimizer.step()`` / ``clip_grad_norm_(...)`` for a call; short source otherwise."""
    if isinstance(node, cst.Call):
        func = code_of(node.func)
        return f"{func}()" if not node.args else f"{func}(...)"
    return shorten(code_of(node))


def shorten(text: str) -> str:
    """Source text on one line, cut to about 60 characters so that it fits in a message.

    The cut falls after a separator (a space, comma or opening bracket), never inside a name
    or a number: ``clip_grad_norm_(model.parameters(), args.c...`` named a setting that does
    not exist (ux review of word_language_model).
    """
    text = " ".join(text.split())
    if len(text) <= 60:
        return text
    head = text[:57]
    cut = max(head.rfind(separator) + 1 for separator in (" ", ",", "(", "["))
    return head[:cut].rstrip() + " ..." if cut > 20 else head + "..."


def optimizer_of(step: Event) -> str | None:
    return step.optimizer or step.receiver


def scaled_backward(unit: Unit, before: Event | None = None) -> Event | None:
    """A ``scaler.scale(loss).backward()`` of the unit (before ``before`` when given)."""
    for event in unit.backwards:
        if event.scaler and (before is None or event.order < before.order):
            return event
    return None


def missing_unscale(unit: Unit, step: Event) -> str | None:
    """The ``scaler.unscale_(optimizer)`` statement that clipping just before ``step`` needs.

    None when no GradScaler scales the unit's backward or the gradients are already unscaled
    before the step.
    """
    backward = scaled_backward(unit, before=step)
    if backward is None or between(unit, backward, step, {"unscale"}):
        return None
    return f"{backward.scaler}.unscale_({optimizer_of(step)})"


def divide(
    expr: cst.BaseExpression, divisor: cst.BaseExpression, *, as_receiver: bool
) -> cst.BaseExpression:
    """``expr / divisor`` with parentheses where the surrounding code needs them."""
    division: cst.BaseExpression = cst.BinaryOperation(
        left=parenthesize(expr.with_changes(lpar=[], rpar=[])) if expr.lpar else parenthesize(expr),
        operator=cst.Divide(),
        right=parenthesize(divisor),
    )
    if as_receiver:
        division = division.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return division


def names_in(node: cst.CSTNode) -> set[str]:
    """The variable names ``node`` reads (attribute names excluded: ``a`` for ``a.b``)."""
    found: set[str] = set()
    for current in walk(node, prune=lambda n: isinstance(n, cst.Attribute)):
        if isinstance(current, cst.Name):
            found.add(current.value)
        elif isinstance(current, cst.Attribute):
            found |= names_in(current.value)
    return found


def has_scaling(node: cst.CSTNode) -> bool:
    """True when ``node`` divides or multiplies something (``/``, ``*``, ``.div()``...).

    Call arguments are not searched: they are inputs of a fresh value (``model(x / 255)``),
    not the scaling of the loss.
    """
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.BinaryOperation) and isinstance(
            current.operator, cst.Divide | cst.Multiply | cst.FloorDivide
        ):
            return True
        if isinstance(current, cst.Call):
            if method_name(current) in SCALING_METHODS:
                return True
            stack.append(current.func)
            continue
        stack.extend(children(current))
    return False


def loss_is_scaled(
    model: FileModel, func: FuncInfo, expr: cst.BaseExpression | None, depth: int = 0
) -> bool:
    """True when the backpropagated loss ``expr`` is (or may be) divided or multiplied.

    Errs towards True: anything the analyser cannot follow counts as scaled, so a rule that
    needs "certainly not divided" stays silent.
    """
    if expr is None or depth > 6:
        return True
    if has_scaling(expr):
        return True
    for name in _lineage(expr):
        if name in func.aug_scaled:
            return True
        values = func.assigns.get(name)
        if not values:
            # A parameter or a name from elsewhere: cannot tell.
            return True
        for value in values:
            if _local_call(model, func, value):
                return True
            if loss_is_scaled(model, func, value, depth + 1):
                return True
    return False


def _local_call(model: FileModel, func: FuncInfo, value: cst.BaseExpression) -> bool:
    """A value computed by a function of this file whose body divides or multiplies."""
    if not isinstance(value, cst.Call):
        return False
    target = model.function_for_call(value, func)
    if target is None:
        return False
    return has_scaling(target.node)


def _lineage(expr: cst.BaseExpression) -> list[str]:
    """The variable(s) a loss expression is derived from: ``loss`` in ``loss.mean()``."""
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, cst.Attribute | cst.Subscript):
        return _lineage(expr.value)
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in TENSOR_METHODS
    ):
        return _lineage(expr.func.value)
    if isinstance(expr, cst.BinaryOperation):
        return _lineage(expr.left) + _lineage(expr.right)
    return []


def first_arg_of_constructor(model: FileModel, variable: str | None) -> str | None:
    """``model.parameters()`` for ``opt = torch.optim.AdamW(model.parameters(), ...)``."""
    if variable is None:
        return None
    call = model.constructors.get(variable)
    if call is None or not call.args or call.args[0].keyword is not None:
        return None
    return code_of(call.args[0].value)


def torch_name(model: FileModel) -> str | None:
    """The local name bound to the ``torch`` module, if any."""
    for local, full in model.aliases.items():
        if full == "torch":
            return local
    return None


def update_anchor(model: FileModel, unit: Unit, stmt: cst.CSTNode) -> cst.CSTNode:
    """The statement of the update that holds ``stmt`` on every path: climbing out of the
    ``if``s between the update's own block and ``stmt`` (``if amp: scaler.step(opt) else:
    opt.step()`` as a whole), so that what is inserted next to it runs on every path."""
    acc = unit.accumulation
    owner: cst.CSTNode | None = None
    if acc is not None and acc.gate is not None:
        owner = acc.gate.node
    elif unit.scope is not None:
        owner = unit.scope.node
    chain = [stmt, *model.ancestors(stmt)]
    best = stmt
    for node in chain[1:]:
        if node is owner or isinstance(node, cst.FunctionDef | cst.Module | cst.For | cst.While):
            break
        if isinstance(node, cst.If | cst.With | cst.Try):
            if isinstance(node, cst.If) and _is_gate(model, node):
                break
            best = node
    return best


def _is_gate(model: FileModel, node: cst.If) -> bool:
    from gradient_doctor.probes.static.model import modulo_divisor

    return modulo_divisor(node.test) is not None or "sync_gradients" in code_of(node.test)


def guarded_statement(model: FileModel, stmt: cst.CSTNode) -> cst.CSTNode | None:
    """What to move for the one-statement line ``stmt``, guards included: the line itself, or
    the ``if`` that holds nothing but it (``if max_grad_norm is not None: clip(...)``) so the
    guard moves with it. None when ``stmt`` cannot move on its own."""
    if not movable(stmt):
        return None
    current: cst.CSTNode = stmt
    while True:
        parents = model.ancestors(current)
        if len(parents) < 2:
            return current
        block, owner = parents[0], parents[1]
        if not (
            isinstance(block, cst.IndentedBlock)
            and isinstance(owner, cst.If)
            and owner.body is block
            and owner.orelse is None
            and len(block.body) == 1
            and not _is_gate(model, owner)
        ):
            return current
        current = owner


def path_guard(model: FileModel, target: cst.CSTNode, anchor: cst.CSTNode) -> str | None:
    """The condition under which ``target`` runs that ``anchor`` does not already imply: the
    tests of the ``if`` branches around ``target`` that are not around ``anchor`` (``"scaler is
    not None"`` for a ``scaler.step()`` in ``if scaler is not None:``). Empty string: none;
    None: one of them is an accumulation gate or an ``elif`` the analyser does not rebuild."""
    around_anchor = {id(node) for node in model.ancestors(anchor)}
    chain = [target, *model.ancestors(target)]
    tests: list[str] = []
    for child, parent in itertools.pairwise(chain):
        if id(parent) in around_anchor:
            break
        if not isinstance(parent, cst.If) or child is parent.test:
            continue
        if _is_gate(model, parent):
            return None
        test = code_of(parent.test)
        if child is parent.body:
            tests.append(test if _simple(parent.test) else f"({test})")
        elif isinstance(child, cst.Else):
            tests.append(f"not ({test})")
        else:
            return None  # an elif chain: leave it to the user
    return " and ".join(reversed(tests))


def _simple(test: cst.BaseExpression) -> bool:
    return not isinstance(test, cst.BooleanOperation | cst.IfExp | cst.Lambda)


def guarded_code(statement: str, condition: str) -> str:
    """``statement``, under ``if condition:`` when there is one."""
    if not condition:
        return statement
    return f"if {condition}:\n    {statement}\n"


def only_without_accumulation(event: Event, acc: Accumulation) -> bool:
    """``event`` runs only when the accumulation count is 1: it is in the body of an ``if``
    whose test says ``N == 1`` (alone or in an ``and``), or in the ``else`` of ``if N > 1:`` /
    ``if N != 1:``. On the paths that accumulate it never runs."""
    if acc.divisor is None or isinstance(acc.divisor, cst.Integer):
        return False
    divisor = code_of(acc.divisor)
    for frame in event.frames:
        if frame.kind != "if" or not isinstance(frame.node, cst.If):
            continue
        test = frame.node.test
        if frame.branch == 0:
            parts = _conjuncts(test)
            if any(_compares_count(p, divisor, cst.Equal) for p in parts):
                return True
        elif frame.branch == 1 and (
            _compares_count(test, divisor, cst.GreaterThan)
            or _compares_count(test, divisor, cst.NotEqual)
        ):
            return True
    return False


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_conjuncts(test.left), *_conjuncts(test.right)]
    return [test]


def _compares_count(test: cst.BaseExpression, divisor: str, operator: type) -> bool:
    """``test`` is ``<divisor> <operator> 1`` (``self.accumulation_steps == 1``)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    return (
        isinstance(target.operator, operator)
        and code_of(test.left) == divisor
        and number_value(target.comparator) == 1
    )
