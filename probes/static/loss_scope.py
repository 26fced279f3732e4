"""Which code computes a loss, or runs in a model's forward pass: across functions, methods,
modules and (with a project index) files.

Real code spreads a loss over helpers: ``ContrastiveLoss.forward`` calls
``self.similarity_fct(a, b)``, which is ``util.cos_sim`` of another module; a perceptual
loss calls ``normalize_tensor`` of its own file; a loss method calls
``self.per_frame_distortion(...)``. An op inside such a helper is loss code as much as one
written in the loss itself. This module finds the loss functions of a file and follows their
calls (a local function or method, a function imported from the project, the ``forward`` of a
module the loss built, a function stored in an attribute or given as a parameter's default, a
function handed as an argument to a project function that calls it) down to
:data:`MAX_REACH` calls deep.

A call whose value is only measured (``.item()``, comparisons) or that runs with autograd off
is not followed: nothing backpropagates through it.

The same walk from every ``forward`` of the file gives the forward scope: code that runs in a
model's forward pass and is differentiated even when nothing in it is called a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst

from gradient_doctor.probes.static.model import FileModel, FuncInfo, attribute_key
from gradient_doctor.probes.static.names import dotted_name, number_value
from gradient_doctor.probes.static.traverse import walk

LOSS_WORDS = ("loss", "cross_entropy", "crossentropy", "nll", "kl_div")
"""Words that name a loss (in a function, a class or a variable)."""
FORWARD_METHODS = frozenset({"forward", "__call__"})
MAX_REACH = 4
"""Calls followed below a loss (or a ``forward``): helpers of helpers of helpers."""
SAME_VALUE_METHODS = frozenset({"to", "float", "double", "half", "cuda", "cpu", "eval", "train"})


def loss_named(name: str) -> bool:
    """A name that says loss: ``loss``, ``nll``, ``cross_entropy``... (any case)."""
    lowered = name.lower()
    return any(word in lowered for word in LOSS_WORDS)


def loss_file(model: FileModel) -> bool:
    """A file whose module path says it holds losses (``losses/pmsqe.py``, ``loss.py``,
    ``dino_loss.py``): its functions and ``forward`` methods compute losses. The path is read
    inside the project (the folder the project was linted from is not part of it), else the
    file's name and its folder's."""
    from gradient_doctor.probes.static.project import ProjectIndex

    name = (
        model.project.module_name(model.path) if isinstance(model.project, ProjectIndex) else None
    )
    if name is not None:
        parts = name.split(".")[-2:]
    else:
        parts = model.path.replace("\\", "/").split("/")[-2:]
    return any("loss" in part.lower() for part in parts)


def _loss_target(target: cst.BaseExpression) -> bool:
    """``loss``, ``self.total_loss``. Not an entry of a collection (``losses["nsdr"] =
    ...``): such dictionaries gather the metrics that are logged with the loss (learned from
    static7 demucs, whose validation SDR goes into ``losses``)."""
    return "loss" in (dotted_name(target) or "").lower()


LOSS_RETURNING_METHODS = frozenset({"training_step"})
"""Methods whose return value is the loss (Lightning's ``training_step``)."""


def assigns_loss(stmt: cst.CSTNode, func: FuncInfo | None = None) -> bool:
    """``loss = ...`` / ``self.total_loss = ...`` / ``loss += ...``: a statement that assigns
    (or adds to) a loss; or (given its function) the ``return`` of a
    method whose return value is the loss (``training_step``)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    first = stmt.body[0]
    if isinstance(first, cst.Assign):
        return any(_loss_target(t.target) for t in first.targets)
    if isinstance(first, cst.AugAssign | cst.AnnAssign) and first.value is not None:
        # `loss += -torch.log(p).mean()`, `loss: Tensor = ...`: a loss built up in place.
        return _loss_target(first.target)
    return (
        isinstance(first, cst.Return)
        and first.value is not None
        and func is not None
        and func.class_name is not None
        and func.name in LOSS_RETURNING_METHODS
    )


@dataclass
class LossScope:
    """The functions (of this file and of others) that are loss code, or forward-pass code.

    ``loss`` and ``forward`` hold function ids; ``functions`` every function reached, with the
    model of the file that defines it."""

    model: FileModel
    loss: set[int] = field(default_factory=set)
    forward: set[int] = field(default_factory=set)
    functions: dict[int, tuple[FileModel, FuncInfo]] = field(default_factory=dict)

    def whole_loss(self, func: FuncInfo) -> bool:
        """Every statement of ``func`` computes (part of) a loss."""
        return id(func) in self.loss

    def in_loss(self, func: FuncInfo, stmt: cst.CSTNode) -> bool:
        """``stmt`` (of ``func``) computes a loss: the function does, or it assigns one."""
        return id(func) in self.loss or assigns_loss(stmt, func)

    def differentiated(self, func: FuncInfo, stmt: cst.CSTNode) -> bool:
        """``stmt`` runs in a loss or in a model's forward pass."""
        return self.in_loss(func, stmt) or id(func) in self.forward

    def foreign(self) -> Iterator[tuple[FileModel, list[FuncInfo]]]:
        """The reached functions of other files, grouped by their file's model."""
        groups: dict[int, tuple[FileModel, list[FuncInfo]]] = {}
        for owner, func in self.functions.values():
            if owner is self.model:
                continue
            groups.setdefault(id(owner), (owner, []))[1].append(func)
        yield from groups.values()


CallFilter = Callable[[FileModel, FuncInfo, cst.Call], bool]


def loss_scope(model: FileModel, followed: CallFilter) -> LossScope:
    """The loss and forward scopes of ``model``. ``followed(model, func, call)`` says whether
    the value of ``call`` (in ``func``) reaches what it is part of (not only measured, not
    under ``no_grad``)."""
    scope = LossScope(model)
    calls = _CallTable()
    seeds: list[tuple[FileModel, FuncInfo]] = []
    in_loss_file = loss_file(model)
    for func in model.functions:
        if (
            _loss_function(model, func)
            or (in_loss_file and _public_entry(func))
            or _overlap_function(func)
            or _returns_negative_log(func)
        ):
            seeds.append((model, func))
    # A function whose result is assigned to a loss (`loss = criterion(cos_sim(a, b), y)`
    # anywhere): followed from the assignment.
    for call, func in _calls_feeding_losses(model):
        # Not a module's `forward` (`loss = model(x)`): a model that returns its loss is
        # read as a loss only where its own code says so.
        callee = resolve_call(model, func, call, modules=False)
        if callee is not None and followed(model, func, call):
            seeds.append((callee.model or model, callee))
    _spread(scope.loss, scope, seeds, calls, followed)
    forwards = [
        (model, func)
        for func in model.functions
        if func.class_name is not None and func.name in FORWARD_METHODS
    ]
    _spread(scope.forward, scope, forwards, calls, followed)
    return scope


def _calls_feeding_losses(model: FileModel) -> Iterator[tuple[cst.Call, FuncInfo]]:
    """The calls written in a ``loss = ...`` assignment (or ``self.total_loss = ...``), in
    any function. The names it reads are not followed back: what reaches a training loop's
    ``loss = criterion(model(x), y)`` through ``x`` and ``y`` is its data pipeline
    (``x, y, adj = load_data()``), which nothing backpropagates into."""
    for call, stmt, func in model.all_calls:
        if assigns_loss(stmt, func):
            yield call, func


def _loss_function(model: FileModel, func: FuncInfo) -> bool:
    """Named like a loss, or ``forward`` / ``__call__`` of a class named like a loss or
    derived from one (``class ArcFace(_WeightedLoss)``)."""
    if loss_named(func.name):
        return True
    if func.name not in FORWARD_METHODS or func.class_name is None:
        return False
    names = [func.class_name, *model.class_bases.get(func.class_name, [])]
    return any("loss" in name.lower() for name in names)


NEGATED_LOGS = frozenset({"log", "log2", "log10", "log_softmax", "logsigmoid", "log_prob"})
"""Calls whose negation, reduced, is a negative log-likelihood."""
REDUCING = frozenset({"sum", "mean"})
EVALUATION_PREFIXES = ("validation", "valid", "val_", "test", "predict", "eval", "score")
"""Names of methods that measure (Lightning's ``validation_step``, ``evaluate``...)."""


def _returns_negative_log(func: FuncInfo) -> bool:
    """The function returns a negative log-likelihood: a negated log (reduced, weighted, or
    plus a regulariser: ``(-torch.log(p).sum() + reg) / n``, ``-(y * p.log()).sum(1)``).
    That value is a loss whatever the function is called: a recommender's ``forward``
    that returns its BPR loss, a density model's ``nll``. Only a value returned alone: a
    flow's ``return y, -torch.log(s * (1 - s)).sum(-1)`` is a log-determinant."""
    if func.name.lower().startswith(EVALUATION_PREFIXES):
        return False  # `validation_step`, `evaluate`: run with autograd off (a metric)
    return any(
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and _log_term(node.expression)
        for value in func.returns
        # `return y, -log_det`: a transform and its log-determinant, not a likelihood.
        if not isinstance(value, cst.Tuple)
        for node in walk(value)
    )


def _log_term(node: cst.BaseExpression) -> bool:
    """``log(p)``, reduced (``.sum()``, ``torch.mean(...)``) or times a weight."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _log_term(node.left) or _log_term(node.right)
    if not isinstance(node, cst.Call):
        return False
    name = (
        node.func.attr.value
        if isinstance(node.func, cst.Attribute)
        else node.func.value
        if isinstance(node.func, cst.Name)
        else ""
    )
    if name in NEGATED_LOGS:
        return True
    if name in REDUCING:
        if isinstance(node.func, cst.Attribute) and not (
            isinstance(node.func.value, cst.Name) and node.func.value.value in {"torch", "th"}
        ):
            return _log_term(node.func.value)
        return bool(node.args) and _log_term(node.args[0].value)
    return False


def _overlap_function(func: FuncInfo) -> bool:
    """The function takes a ratio from 1 (``iou = inter / union``; ``1 - iou``): the shape of
    the IoU, GIoU, CIoU and Dice losses, trained on whatever the function is called."""
    if not isinstance(func.node, cst.FunctionDef):
        return False
    ratios = {
        name
        for name, values in func.assigns.items()
        if any(
            isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Divide)
            for v in values
        )
    }
    complemented = {
        node.right.value
        for node in walk(func.node.body)
        if isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Subtract)
        and isinstance(node.right, cst.Name)
        and node.right.value in ratios
        and number_value(node.left) == 1
    }
    # Read only where a `1 - ratio` is written: the interpolation check walks every statement.
    return bool(complemented) and bool(complemented - interpolated_ratios(func))


def interpolated_ratios(func: FuncInfo) -> set[str]:
    """Names ``t`` that the function uses with ``1 - t`` in one expression: a polynomial or
    an interpolation in ``t`` (``t * (1 - t)``, a spline's ``a * t ** 2 + b * (1 - t) ** 2``,
    a blend ``t * x + (1 - t) * y``). There ``t`` is a position inside an interval (a
    fraction of a bin's width, a mixing weight), not an overlap: an IoU or Dice loss takes
    ``1 - iou`` alone (or weighted by something else) as its value."""
    if not isinstance(func.node, cst.FunctionDef):
        return set()
    found: set[str] = set()
    for stmt in walk(func.node.body, prune=_nested_definition):
        if not isinstance(stmt, cst.Assign | cst.AugAssign | cst.AnnAssign | cst.Return | cst.Expr):
            continue
        value = stmt.value
        if value is None:
            continue
        complements = [
            node
            for node in walk(value)
            if isinstance(node, cst.BinaryOperation)
            and isinstance(node.operator, cst.Subtract)
            and number_value(node.left) == 1
            and isinstance(node.right, cst.Name)
        ]
        for complement in complements:
            name = cst.ensure_type(complement.right, cst.Name).value
            inside = {id(n) for n in walk(complement)}
            if any(
                isinstance(node, cst.Name) and node.value == name and id(node) not in inside
                for node in walk(value)
            ):
                found.add(name)
    return found


def _nested_definition(node: cst.CSTNode) -> bool:
    """A nested function or class: its statements belong to another scope."""
    return isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda)


def _public_entry(func: FuncInfo) -> bool:
    """A top-level function or a ``forward`` of a loss file: what its users call."""
    if func.class_name is None:
        return not func.name.startswith("_")
    return func.name in FORWARD_METHODS


def _spread(
    marked: set[int],
    scope: LossScope,
    seeds: list[tuple[FileModel, FuncInfo]],
    calls: _CallTable,
    followed: CallFilter,
) -> None:
    frontier = [(owner, func, 0) for owner, func in seeds]
    while frontier:
        owner, func, depth = frontier.pop()
        if id(func) in marked:
            continue
        marked.add(id(func))
        scope.functions[id(func)] = (owner, func)
        if depth >= MAX_REACH:
            continue
        for call in calls.of(owner, func):
            callee = resolve_call(owner, func, call)
            # Resolved first: most calls are library calls, and `followed` reads the function.
            if callee is None or not followed(owner, func, call):
                continue
            if id(callee) not in marked:
                frontier.append((callee.model or owner, callee, depth + 1))
            # `_pairwise(x, y, _euclidean)`: a project function handed to a project function
            # is called by it (`dist_func(x, y)`), on the same values.
            for passed in _functions_passed(owner, func, call):
                if id(passed) not in marked and passed is not callee:
                    frontier.append((passed.model or owner, passed, depth + 1))


def _functions_passed(model: FileModel, func: FuncInfo, call: cst.Call) -> list[FuncInfo]:
    """The project functions given as arguments of ``call`` (by name, not called)."""
    found = []
    for arg in call.args:
        if not isinstance(arg.value, cst.Name | cst.Attribute) or arg.star:
            continue
        try:
            target = model.function_for_call(cst.Call(func=arg.value), func)
        except RecursionError:
            continue
        if target is not None:
            found.append(target)
    return found


class _CallTable:
    """The calls of each function, grouped once per file."""

    def __init__(self) -> None:
        self._by_model: dict[int, dict[int, list[cst.Call]]] = {}

    def of(self, model: FileModel, func: FuncInfo) -> list[cst.Call]:
        table = self._by_model.get(id(model))
        if table is None:
            table = {}
            for call, _, owner in model.all_calls:
                table.setdefault(id(owner), []).append(call)
            self._by_model[id(model)] = table
        return table.get(id(func), [])


def resolve_call(
    model: FileModel, func: FuncInfo, call: cst.Call, *, modules: bool = True
) -> FuncInfo | None:
    """The project function ``call`` runs: a function or method (local, or of another file
    of the project), the ``forward`` of a module built in the code (``self.net = Net()``;
    ``self.net(x)``), or a function stored in an attribute (``self.fct = fct`` with
    ``fct=util.cos_sim`` as the parameter's default). ``modules=False`` leaves modules'
    ``forward`` out."""
    try:
        found = model.function_for_call(call, func)
    except RecursionError:
        return None
    if found is not None:
        return found
    text = dotted_name(call.func)
    if text is None:
        return None
    if isinstance(call.func, cst.Name):
        values = func.assigns.get(text, []) or model.module_info.assigns.get(text, [])
    else:
        values = model.attribute_assigns.get(attribute_key(text, func.class_name), [])
    targets = {id(v): v for v in values}
    if len(targets) != 1:
        return None
    (value,) = targets.values()
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in SAME_VALUE_METHODS
    ):
        value = value.func.value  # `Net(...).to(device)`
    if isinstance(value, cst.Call):
        return _forward_of(model, value) if modules else None
    if isinstance(value, cst.Name) and func.class_name is not None:
        # `self.fct = fct` in `__init__(self, fct=util.cos_sim)`: the default.
        value = _parameter_default(model, func.class_name, value.value) or value
    if isinstance(value, cst.Name | cst.Attribute):
        try:
            return model.function_for_call(cst.Call(func=value), func)
        except RecursionError:
            return None
    return None


def _forward_of(model: FileModel, constructor: cst.Call) -> FuncInfo | None:
    """``Net.forward`` for ``Net(...)`` (a class of this file or of the project)."""
    name = dotted_name(constructor.func)
    if name is None:
        return None
    if name in model.class_nodes:
        return model.method_of(name, "forward")
    if model.project is not None and name.split(".", 1)[0] in model.aliases:
        return model.project.class_method(model.qualify_text(name), "forward", model)
    return None


def _parameter_default(model: FileModel, class_name: str, name: str) -> cst.BaseExpression | None:
    """The default of parameter ``name`` of ``class_name.__init__``."""
    init = model.methods.get((class_name, "__init__"))
    if init is None or not isinstance(init.node, cst.FunctionDef):
        return None
    params = init.node.params
    for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
        if param.name.value == name:
            return param.default
    return None
