"""The safety checks every patch passes before it is offered.

"It parses and the finding is gone" is not enough: a patch that moves a clip out of ``if
max_grad_norm is not None:``, moves ``zero_grad()`` into one branch of ``if scaler: ... else:
...``, or uses a name that is not bound yet also parses and also silences the finding. So a
patch is offered only when:

* it empties no block (``if max_grad_norm is not None:`` never becomes ``pass``);
* every statement it moves keeps the guards it had: the same ``if`` branches, loops, ``with``
  blocks and function around it, except for the ones the fix is about (entering the
  accumulation update's ``if (i + 1) % N == 0:`` / ``if accelerator.sync_gradients:``, or
  leaving the micro-step loop for the update after it);
* what it moves or inserts runs on every path where the statements it accompanies run (a
  ``zero_grad()`` placed after the update runs after the step of every branch);
* every name it uses is bound at the point of use, and a moved statement neither reads a name
  that is re-bound between its old and new place nor binds one that is read there;
* it does not move the ``zero_grad()`` of one of several optimizers.

The checks that need the patched program (no second ``unscale_`` per step, no ``unscale_`` on
every micro-step) run in the engine on the re-analysed result: see :func:`amp_hazards`.
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from gradient_doctor.probes.static.model import FileModel, checks_unscaled_state, modulo_divisor
from gradient_doctor.probes.static.names import code_of, method_name
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import accumulating_units, label, shorten
from gradient_doctor.probes.static.traverse import calls_in, children

__all__ = ["amp_hazards", "check_patch"]

BUILTIN_NAMES = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__"}


@dataclass(frozen=True)
class _Guard:
    """One enclosing construct of a statement."""

    node: cst.CSTNode
    branch: int
    """For an ``if``: 0 body, 1 else/elif; for a ``try``: 0 body, 1 handler/else/finally."""

    def describe(self) -> str:
        node = self.node
        if isinstance(node, cst.If):
            where = "" if self.branch == 0 else " (else branch)"
            return f"`if {shorten(code_of(node.test))}:`{where}"
        if isinstance(node, cst.For):
            return f"`for {shorten(code_of(node.target))} in ...:`"
        if isinstance(node, cst.While):
            return f"`while {shorten(code_of(node.test))}:`"
        if isinstance(node, cst.With):
            return f"`with {shorten(code_of(node.items[0].item))}:`"
        if isinstance(node, cst.FunctionDef):
            return f"`def {node.name.value}`"
        return type(node).__name__


def _guards(model: FileModel, stmt: cst.CSTNode) -> list[_Guard]:
    """The constructs around ``stmt``, outermost first."""
    chain = [stmt, *model.ancestors(stmt)]
    out: list[_Guard] = []
    for child, parent in itertools.pairwise(chain):
        if isinstance(parent, cst.If):
            if child is parent.test:
                continue
            out.append(_Guard(parent, 0 if child is parent.body else 1))
        elif isinstance(parent, cst.For | cst.While):
            if child is parent.body:
                out.append(_Guard(parent, 0))
            elif parent.orelse is not None and child is parent.orelse:
                out.append(_Guard(parent, 1))
        elif isinstance(parent, cst.With):
            if child is parent.body:
                out.append(_Guard(parent, 0))
        elif isinstance(parent, cst.Try | cst.TryStar):
            out.append(_Guard(parent, 0 if child is parent.body else 1))
        elif isinstance(
            parent, cst.ExceptHandler | cst.ExceptStarHandler | cst.FunctionDef | cst.ClassDef
        ):
            out.append(_Guard(parent, 0))
    out.reverse()
    return out


def _free(model: FileModel, guard: _Guard) -> bool:
    """Guards a fix may add or remove: the accumulation update's own ``if``, the micro-step
    loop, and ``with`` blocks that do not change which gradients exist (autocast...)."""
    node = guard.node
    if isinstance(node, cst.If):
        return modulo_divisor(node.test) is not None or "sync_gradients" in code_of(node.test)
    if isinstance(node, cst.For):
        return any(
            unit.micro is not None and unit.micro.node is node and unit.scope is not unit.micro
            for unit in model.units
        )
    if isinstance(node, cst.With):
        names = {method_name(call) for item in node.items for call in calls_in(item.item)}
        return not names & {"accumulate", "no_sync", "no_backward_sync"}
    return False


def check_patch(model: FileModel, patch: Patch) -> str | None:
    """None when ``patch`` is safe by the rules above, else the reason it is not."""
    for check in (_no_empty_block, _moves_keep_guards, _covers_every_path, _names_bound):
        reason = check(model, patch)
        if reason is not None:
            return reason
    return _one_optimizer(model, patch)


def _no_empty_block(model: FileModel, patch: Patch) -> str | None:
    removed: dict[int, int] = {}
    blocks: dict[int, cst.CSTNode] = {}
    for stmt in patch.remove:
        parents = model.ancestors(stmt)
        if not parents:
            return "it edits code outside this file"
        block = parents[0]
        removed[id(block)] = removed.get(id(block), 0) + 1
        blocks[id(block)] = block
    anchors = [a for a, _ in patch.before] + [a for a, _ in patch.after]
    for key, count in removed.items():
        block = blocks[key]
        if not isinstance(block, cst.IndentedBlock):
            continue
        added = sum(1 for a in anchors if any(a is s for s in block.body))
        if count >= len(block.body) and not added:
            owner = model.ancestors(block)
            around = _Guard(owner[0], 0).describe() if owner else "a block"
            return f"it would leave {around} empty (the guard must keep its statement)"
    return None


def _placed(
    patch: Patch,
) -> Iterator[tuple[cst.CSTNode, cst.CSTNode, cst.CSTNode | None, bool]]:
    """(what is placed, the anchor it goes next to, the original statement if it is moved,
    True when it goes after the anchor)."""
    for stmt, anchor, after in patch.moves:
        yield stmt, anchor, stmt, after
    for anchor, stmt, after in patch.inserts:
        yield stmt, anchor, None, after


def _moves_keep_guards(model: FileModel, patch: Patch) -> str | None:
    for stmt, anchor, _ in patch.moves:
        before = [g for g in _guards(model, stmt) if not _free(model, g)]
        after = [g for g in _guards(model, anchor) if not _free(model, g)]
        if before != after:
            lost = [g for g in before if g not in after]
            gained = [g for g in after if g not in before]
            if lost:
                return (
                    f"moving `{shorten(code_of(stmt))}` would take it out of {lost[0].describe()}"
                )
            return (
                f"moving `{shorten(code_of(stmt))}` would put it under "
                f"{gained[0].describe()}, so it would run on one path only"
            )
    return None


def _covers_every_path(model: FileModel, patch: Patch) -> str | None:
    if not patch.covers:
        return None
    for placed, anchor, _, _ in _placed(patch):
        where = {g for g in _guards(model, anchor) if isinstance(g.node, cst.If)}
        for other in patch.covers:
            around = {g for g in _guards(model, other) if isinstance(g.node, cst.If)}
            missing = where - around
            if missing:
                guard = next(iter(missing))
                return (
                    f"`{shorten(code_of(placed))}` would run only under {guard.describe()}, "
                    f"not wherever `{label(other)}` runs"
                )
    return None


def _one_optimizer(model: FileModel, patch: Patch) -> str | None:
    for stmt, _, _ in patch.moves:
        if not any(method_name(c) == "zero_grad" for c in calls_in(stmt)):
            continue
        function = _function_of(model, stmt)
        receivers = {
            code_of(c.func.value)
            for c in calls_in(function)
            if method_name(c) == "zero_grad" and isinstance(c.func, cst.Attribute)
        }
        if len(receivers) > 1:
            return (
                "the function zeroes the gradients of several optimizers "
                f"({', '.join(sorted(receivers))}); moving one of them is not safe"
            )
    return None


# -- names ------------------------------------------------------------------------------------


def _function_of(model: FileModel, node: cst.CSTNode) -> cst.CSTNode:
    for parent in model.ancestors(node):
        if isinstance(parent, cst.FunctionDef):
            return parent
    return model.module


class _Scope:
    """The statements of one function in source order, with the names each binds and reads."""

    def __init__(self, owner: cst.CSTNode) -> None:
        self.order: dict[int, int] = {}
        self.end: dict[int, int] = {}
        self.binds: list[tuple[int, str]] = []
        self.reads: list[tuple[int, str]] = []
        self.params: set[str] = set()
        if isinstance(owner, cst.FunctionDef):
            self.params = _param_names(owner.params)
            body: cst.CSTNode = owner.body
        else:
            body = owner
        self._counter = 0
        self._visit(body)

    def _visit(self, node: cst.CSTNode) -> None:
        is_statement = isinstance(node, cst.BaseStatement)
        if is_statement:
            self._counter += 1
            self.order[id(node)] = self._counter
            index = self._counter
            for name in _bound_by(node):
                self.binds.append((index, name))
            for name in _read_by_header(node):
                self.reads.append((index, name))
        if isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda) and is_statement:
            self.end[id(node)] = self._counter
            return  # a nested scope: its own statements are not ours
        for kid in children(node):
            if isinstance(kid, cst.BaseStatement | cst.BaseSuite) or _holds_statements(kid):
                self._visit(kid)
        if is_statement:
            self.end[id(node)] = self._counter

    def bound_before(self, position: float) -> set[str]:
        return {name for index, name in self.binds if index < position}

    def bound_between(self, low: float, high: float) -> set[str]:
        return {name for index, name in self.binds if low < index < high}

    def read_between(self, low: float, high: float) -> set[str]:
        return {name for index, name in self.reads if low < index < high}


def _holds_statements(node: cst.CSTNode) -> bool:
    return isinstance(
        node,
        cst.Else | cst.ExceptHandler | cst.ExceptStarHandler | cst.Finally | cst.If,
    )


def _param_names(params: cst.Parameters) -> set[str]:
    names = {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names


def _target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple | cst.List):
        out: set[str] = set()
        for element in target.elements:
            out |= _target_names(element.value)
        return out
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def _bound_by(stmt: cst.CSTNode) -> set[str]:
    """Names a statement binds in its own scope (its header only, for a compound one)."""
    out: set[str] = set()
    if isinstance(stmt, cst.SimpleStatementLine | cst.SimpleStatementSuite):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    out |= _target_names(target.target)
            elif isinstance(small, cst.AnnAssign | cst.AugAssign):
                out |= _target_names(small.target)
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is not None:
                        out |= _target_names(alias.asname.name)
                    else:
                        out.add(code_of(alias.name).split(".", 1)[0])
            elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if alias.asname is not None:
                        out |= _target_names(alias.asname.name)
                    else:
                        out.add(code_of(alias.name))
            elif isinstance(small, cst.Global | cst.Nonlocal):
                out |= {n.name.value for n in small.names}
        for node in _walk_expressions(stmt):
            if isinstance(node, cst.NamedExpr):
                out |= _target_names(node.target)
    elif isinstance(stmt, cst.For):
        out |= _target_names(stmt.target)
    elif isinstance(stmt, cst.With):
        for item in stmt.items:
            if item.asname is not None:
                out |= _target_names(item.asname.name)
    elif isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        out.add(stmt.name.value)
    elif isinstance(stmt, cst.Try | cst.TryStar):
        for handler in stmt.handlers:
            if handler.name is not None:
                out |= _target_names(handler.name.name)
    return out


_NOT_READ_FIELDS = {
    (cst.Attribute, "attr"),
    (cst.Arg, "keyword"),
    (cst.Param, "name"),
    (cst.FunctionDef, "name"),
    (cst.ClassDef, "name"),
    (cst.ImportAlias, "name"),
    (cst.AsName, "name"),
}


def _walk_expressions(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for kid in children(current):
            if isinstance(kid, cst.BaseCompoundStatement | cst.BaseSuite):
                continue
            stack.append(kid)


def _reads(node: cst.CSTNode) -> set[str]:
    """Names read by ``node`` (a simple statement, or an expression). Names it only binds
    (assignment targets) are not read; comprehension targets and lambda parameters are local."""
    reads: set[str] = set()
    local: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            reads.add(current.value)
            continue
        if isinstance(current, cst.Import | cst.ImportFrom | cst.Global | cst.Nonlocal):
            continue
        if isinstance(current, cst.CompFor):
            local |= _target_names(current.target)
        elif isinstance(current, cst.Lambda):
            local |= _param_names(current.params)
        for field_name in _fields(current):
            if (type(current), field_name) in _NOT_READ_FIELDS:
                continue
            value = getattr(current, field_name)
            kids = value if isinstance(value, tuple | list) else [value]
            for kid in kids:
                if not isinstance(kid, cst.CSTNode) or isinstance(kid, cst.BaseSuite):
                    continue
                if _pure_target(current, field_name, kid):
                    continue
                stack.append(kid)
    return reads - local


def _pure_target(parent: cst.CSTNode, field_name: str, kid: cst.CSTNode) -> bool:
    """A name that is only bound here (``x`` in ``x = ...``, ``for x in``, ``(x := ...)``)."""
    if isinstance(parent, cst.AssignTarget) and field_name == "target":
        return isinstance(kid, cst.Name | cst.Tuple | cst.List) and not _reads_inside(kid)
    if isinstance(parent, cst.AnnAssign) and field_name in {"target", "annotation"}:
        return field_name == "annotation" or isinstance(kid, cst.Name)
    if isinstance(parent, cst.For | cst.CompFor) and field_name == "target":
        return not _reads_inside(kid)
    if isinstance(parent, cst.NamedExpr) and field_name == "target":
        return True
    return isinstance(parent, cst.Del)


def _reads_inside(target: cst.CSTNode) -> bool:
    """A target that reads something: ``a.b = ...`` reads ``a``, ``x[i] = ...`` reads both."""
    if isinstance(target, cst.Name):
        return False
    if isinstance(target, cst.Tuple | cst.List):
        return any(_reads_inside(e.value) for e in target.elements)
    if isinstance(target, cst.StarredElement):
        return _reads_inside(target.value)
    return True


def _fields(node: cst.CSTNode) -> tuple[str, ...]:
    from gradient_doctor.probes.static.traverse import _child_fields

    return _child_fields(type(node))


def _read_by_header(stmt: cst.CSTNode) -> set[str]:
    if isinstance(stmt, cst.SimpleStatementLine | cst.SimpleStatementSuite):
        return _reads(stmt)
    if isinstance(stmt, cst.If | cst.While):
        return _reads(stmt.test)
    if isinstance(stmt, cst.For):
        return _reads(stmt.iter)
    if isinstance(stmt, cst.With):
        return set().union(*(_reads(item.item) for item in stmt.items))
    return set()


def _module_names(model: FileModel) -> set[str]:
    names: set[str] = set()
    for stmt in model.module.body:
        names |= _bound_by(stmt)
        if isinstance(stmt, cst.If | cst.Try | cst.With | cst.For | cst.While):
            # Module-level code under `if __name__ == "__main__":` and friends.
            names |= _Scope(stmt).bound_before(float("inf"))
    return names


def _enclosing_params(model: FileModel, node: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    for parent in model.ancestors(node):
        if isinstance(parent, cst.FunctionDef):
            names |= _param_names(parent.params)
            names |= _Scope(parent).bound_before(float("inf"))
    return names


def _names_bound(model: FileModel, patch: Patch) -> str | None:
    scopes: dict[int, _Scope] = {}
    module_names: set[str] | None = None
    for placed, anchor, original, after in _placed(patch):
        owner = _function_of(model, anchor)
        if original is not None and _function_of(model, original) is not owner:
            return f"moving `{shorten(code_of(placed))}` would take it into another function"
        scope = scopes.get(id(owner))
        if scope is None:
            scope = scopes[id(owner)] = _Scope(owner)
        anchor_index = scope.order.get(id(anchor))
        if anchor_index is None:
            return "it anchors on a statement the analyser cannot place"
        position = scope.end.get(id(anchor), anchor_index) + 0.5 if after else anchor_index - 0.5
        if isinstance(placed, cst.BaseCompoundStatement):
            reads = _reads_compound(placed)
        else:
            reads = _reads(placed)
        known = scope.params | scope.bound_before(position) | BUILTIN_NAMES
        if module_names is None:
            module_names = _module_names(model)
        if isinstance(owner, cst.FunctionDef):
            known |= module_names | _enclosing_params(model, owner)
        # A name the code already reads here but never binds in this function or the module
        # comes from outside (a star import, an injected global): the patch relies on it no
        # more than the code does.
        bound_here = {name for _, name in scope.binds} | scope.params | module_names
        known |= {name for _, name in scope.reads} - bound_here
        if original is not None:
            # A moved statement's own names are bound where it was; they must be where it goes.
            old = scope.order.get(id(original))
            if old is None:
                return "it moves a statement the analyser cannot place"
            low, high = sorted((old, position))
            rebound = reads & scope.bound_between(low, high)
            if rebound:
                return (
                    f"`{sorted(rebound)[0]}` is re-bound between the old and the new place of "
                    f"`{shorten(code_of(placed))}`"
                )
            binds = _bound_by(original) | _bound_inside(original)
            used = binds & scope.read_between(low, high)
            if used:
                return (
                    f"`{sorted(used)[0]}`, bound by `{shorten(code_of(placed))}`, is used "
                    "between its old and its new place"
                )
        unbound = sorted(reads - known)
        if unbound:
            return f"`{unbound[0]}` is not bound where `{shorten(code_of(placed))}` would go"
    return None


def _reads_compound(stmt: cst.BaseCompoundStatement) -> set[str]:
    scope = _Scope(stmt)
    return {
        name
        for index, name in scope.reads
        if name not in {bound for where, bound in scope.binds if where < index}
    }


def _bound_inside(stmt: cst.CSTNode) -> set[str]:
    if isinstance(stmt, cst.BaseCompoundStatement):
        return _Scope(stmt).bound_before(float("inf"))
    return set()


# -- AMP hazards on the patched program ---------------------------------------------------------


def amp_hazards(model: FileModel) -> int:
    """How many ``scaler.unscale_`` calls would raise at run time: one that runs on every
    micro-step of an accumulation (the second micro-step calls it again before ``update()``),
    or a second one on the same path before the step."""
    count = 0
    for unit, _, _ in accumulating_units(model):
        count += sum(1 for u in unit.of_kind("unscale") if unit.in_micro_step(u))
    for unit in model.units:
        unscales = unit.of_kind("unscale")
        for index, first in enumerate(unscales):
            for second in unscales[index + 1 :]:
                if (first.optimizer or "") != (second.optimizer or ""):
                    continue
                if checks_unscaled_state(second):
                    continue
                from gradient_doctor.probes.static.model import exclusive

                if exclusive(first, second):
                    continue
                steps = [
                    s
                    for s in unit.steps
                    if first.order < s.order < second.order and not exclusive(s, second)
                ]
                if not steps:
                    count += 1
    return count
