"""Evidence that a value can reach 0, read from how the code makes it.

:mod:`positivity` answers "is this value positive by construction?". A value it cannot prove
positive is not thereby a hazard: a parameter, a model's output, an attribute or the result
of a call the analyser cannot follow may well be kept off 0 by code it does not see (a
``LowerBound`` op inside a compression model, a schedule that is positive by its formula).
This module answers the other question, "does the code show that the value can reach 0?",
and says why or what it does not know:

* shown: a probability (``softmax``, ``sigmoid``: they underflow to exactly 0), ``1 - p``
  and any other difference of two values, a clamp or ``relu`` at 0, a distance between two
  rows, a count of selected elements, and anything built from these by reductions,
  selections, products and joins; a parameter named as a probability (``probs``, ``p``), or
  one that a caller fills with such a value;
* unknown: everything else, with the name of what was not known (``it comes from
  `self.entropy_bottleneck(...)```).

``unstable-loss-op`` warns on shown evidence only; unknown provenance is an info at most."""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from gradient_doctor.probes.static.model import FuncInfo, attribute_key, bind_arguments
from gradient_doctor.probes.static.names import code_of, dotted_name, number_value
from gradient_doctor.probes.static.positivity import (
    JOINS,
    LIBRARY_HEADS,
    MAX_DEPTH,
    NORMS,
    POSITIVE_CALLS,
    SELECTIONS,
    Positivity,
    called_name,
    clamp_bound,
    reaching_value,
)
from gradient_doctor.probes.static.ruletools import shorten
from gradient_doctor.probes.static.traverse import walk

PROBABILITY_CALLS = frozenset({"softmax", "sigmoid", "softmin", "gumbel_softmax"})
"""Calls that make probabilities: float32 rounds a small one to exactly 0."""
ZERO_FLOORS = frozenset({"relu", "relu_", "relu6", "hardtanh"})
"""Calls that send every negative input to exactly 0."""
DISTANCES = frozenset({"cdist", "pairwise_distance", "dist"})
SPECTRA = frozenset({"stft", "fft", "rfft", "fft2", "rfft2", "fftn", "rfftn", "spectrogram"})
"""Spectra: every bin of a silent (or band-limited) input is 0."""
PRODUCTS = frozenset({"matmul", "mm", "bmm", "einsum", "linear", "mul", "outer", "dot"})
"""Products: 0 where a factor is."""
"""Distances between rows: 0 where two rows coincide (a row and itself)."""
FOLLOWED_CALLS = frozenset(
    {"sum", "mean", "cumsum", "prod", "cumprod", "amax", "max", "nansum", "flip", "roll"}
    | {"abs", "square", "pow", "sqrt", "nan_to_num", "squeeze", "unsqueeze", "flatten"}
    | SELECTIONS
    | NORMS
)
"""Calls whose value can be 0 when their input can (a reduction, a selection, a power)."""
MASK_WORDS = frozenset({"mask", "masks"})
"""Name parts that say a value is a 0/1 mask (``mask``, ``pos_mask``; not ``masked_x``)."""
PROBABILITY_WORDS = frozenset(
    {"p", "pt", "prob", "probs", "proba", "probas", "probability", "probabilities", "pi"}
)
"""Name parts that say a value is a probability (``probs``, ``p_t``, ``pred_prob``)."""


class Evidence(NamedTuple):
    """What the code says about whether a value can reach 0.

    ``shown`` is True when the code shows a way to 0 (``reason`` says which); False when it
    does not tell (``reason`` says what is not known, ``source`` is that expression)."""

    shown: bool
    reason: str
    source: str = ""
    leaf: str = ""
    """For unknown evidence, what the analyser could not look into: ``parameter``, ``call``
    (an unresolved call: a model's output), ``attribute`` or ``name`` (a loop variable, a
    list filled in a loop); empty when it looked and found nothing that reaches 0 (worth no
    message at all)."""
    signed: bool = False
    """For shown evidence, whether the value can also be negative (a difference): added to a
    positive offset it can still cancel it."""

    @property
    def opaque(self) -> bool:
        """Unknown because the value comes from something the analyser cannot read."""
        return not self.shown and bool(self.leaf)


def _unknown(node: cst.BaseExpression, what: str, leaf: str = "") -> Evidence:
    text = shorten(code_of(node))
    return Evidence(False, what.format(text=text), text, leaf)


def probability_name(name: str) -> bool:
    """``probs``, ``p_t``, ``pred_prob``, ``pi``: a name that says it holds probabilities."""
    parts = [part for part in name.lower().split("_") if part]
    return any(part in PROBABILITY_WORDS for part in parts)


def named_evidence(name: str) -> Evidence | None:
    """What a name says of a value the code does not show: a probability or a mask can be 0
    (this is the author's own word, read only where the value's making is out of sight)."""
    if probability_name(name):
        return Evidence(True, f"`{name}` is named as a probability, and one can be 0")
    if any(part in MASK_WORDS for part in name.lower().split("_")):
        return Evidence(True, f"`{name}` is named as a mask, 0 where it drops an element")
    return None


class ZeroEvidence:
    """Reads, for one file, whether a value can reach 0 (see the module's docstring)."""

    def __init__(self, positivity: Positivity) -> None:
        self.positivity = positivity
        self.model = positivity.model
        self._caller_table: dict[int, list[tuple[cst.Call, FuncInfo]]] | None = None
        self._caller_model: object = None
        self._order: dict[int, dict[int, int]] = {}

    def of(self, node: cst.BaseExpression, func: FuncInfo) -> Evidence:
        """The evidence for ``node`` read in ``func``."""
        return self._of(node, func, 0, frozenset())

    def _of(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        node = Positivity._same_value(node)
        if depth > MAX_DEPTH:
            return _unknown(node, "cannot follow `{text}` further")
        value = number_value(node, arithmetic=True)
        if value is not None:
            if value == 0:
                return Evidence(True, "it is 0")
            return _unknown(node, "`{text}` is a constant")
        if isinstance(node, cst.Name | cst.Attribute):
            reaching = reaching_value(func.model or self.model, node)
            if reaching is not None and _empty_container(reaching):
                return _unknown(node, "`{text}` is filled element by element", "name")
            if reaching is not None:
                found = self._of(reaching, func, depth + 1, seen | {code_of(node)})
                if isinstance(node, cst.Name) and found.opaque and found.leaf == "call":
                    return named_evidence(node.value) or found
                return found
        if isinstance(node, cst.Name):
            return self._name(node, func, depth, seen)
        if isinstance(node, cst.Attribute):
            return self._attribute(node, func, depth, seen)
        if isinstance(node, cst.Subscript):
            return self._of(node.value, func, depth + 1, seen)
        if isinstance(node, cst.UnaryOperation):
            return self._of(node.expression, func, depth + 1, seen)
        if isinstance(node, cst.BinaryOperation):
            return self._operation(node, func, depth, seen)
        if isinstance(node, cst.Comparison):
            return Evidence(True, f"`{shorten(code_of(node))}` is 0 wherever it does not hold")
        if isinstance(node, cst.Call):
            return self._call(node, func, depth, seen)
        if _empty_container(node):
            return _unknown(node, "it is filled element by element", "name")
        if isinstance(node, cst.List | cst.Tuple):
            elements = [e.value for e in node.elements if isinstance(e, cst.Element)]
            return self._any(elements, func, depth, seen, node)
        return _unknown(node, "cannot tell how `{text}` is made")

    def _any(
        self,
        nodes: list[cst.BaseExpression],
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        whole: cst.BaseExpression,
    ) -> Evidence:
        """The first shown evidence among ``nodes``; else the first part the analyser could
        not read (a parameter, a call), else an unknown of ``whole`` worth no message."""
        opaque: Evidence | None = None
        for inner in nodes:
            found = self._of(inner, func, depth + 1, seen)
            if found.shown:
                return found
            if opaque is None and found.opaque:
                opaque = found
        return opaque or _unknown(whole, "cannot tell whether a part of `{text}` can be 0")

    def _name(self, node: cst.Name, func: FuncInfo, depth: int, seen: frozenset[str]) -> Evidence:
        name = node.value
        values = [
            v
            for v in func.assigns.get(name, [])
            if not (isinstance(own := Positivity._same_value(v), cst.Name) and own.value == name)
        ]
        if name in seen:
            values = []
        values = self._before(node, values, func)
        found = self._any(values, func, depth, seen | {name}, node) if values else None
        if found is not None and found.shown:
            return found
        if name in func.params and (found is None or found.opaque):
            return named_evidence(name) or self._parameter(name, func, depth)
        if found is not None:
            if found.opaque and found.leaf == "call":
                return named_evidence(name) or found
            return found
        module = (func.model or self.model).module_info
        constants = module.assigns.get(name, []) if module is not func else []
        if len(constants) == 1:
            return self._of(constants[0], module, depth + 1, seen | {name})
        source = _loop_source(func, name)
        if source is not None:
            return Evidence(False, f"it is taken from `{shorten(code_of(source))}`", name, "name")
        return _unknown(node, "`{text}` is a loop variable or a global", "name")

    def _before(
        self, read: cst.Name, values: list[cst.BaseExpression], func: FuncInfo
    ) -> list[cst.BaseExpression]:
        """The definitions written before ``read`` in ``func``: a later one
        (``y = y[:, None] - y[None, :]`` after ``norms = (y ** 2).sum(1) ** 0.5``) cannot
        reach it outside a loop, and a loop's earlier read the analyser does not chase."""
        order = self._order.get(id(func))
        if order is None:
            order = self._order[id(func)] = {id(n): i for i, n in enumerate(walk(func.node))}
        at = order.get(id(read))
        if at is None:
            return values
        return [v for v in values if order.get(id(v), -1) < at]

    def _parameter(self, name: str, func: FuncInfo, depth: int) -> Evidence:
        """A parameter shows a way to 0 when a caller in its file passes one that does."""
        node = func.node
        if isinstance(node, cst.FunctionDef) and depth < MAX_DEPTH:
            for call, caller in self._callers(func):
                argument = dict(bind_arguments(call, node)).get(name)
                if argument is None:
                    continue
                found = self._of(argument, caller, depth + 1, frozenset())
                if found.shown:
                    return Evidence(
                        True,
                        f"a caller passes `{shorten(code_of(argument))}` as `{name}`: "
                        f"{found.reason}",
                    )
        return Evidence(
            False,
            f"it is the parameter `{name}`, and no caller in this file shows what it holds",
            name,
            "parameter",
        )

    def _callers(self, func: FuncInfo) -> list[tuple[cst.Call, FuncInfo]]:
        """The calls of ``func`` in its file, a module's ``forward`` called through the
        attribute that holds the module (``self.term(a, b)``) included."""
        model = func.model or self.model
        if self._caller_table is None or self._caller_model is not model:
            table: dict[int, list[tuple[cst.Call, FuncInfo]]] = {}
            for call, _, caller in model.all_calls:
                callee = self.positivity._callee(call, caller)
                if callee is not None:
                    table.setdefault(id(callee), []).append((call, caller))
            self._caller_table, self._caller_model = table, model
        return self._caller_table.get(id(func), [])

    def _attribute(
        self, node: cst.Attribute, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        text = dotted_name(node)
        model = func.model or self.model
        if text is not None and text not in seen:
            for value in model.attribute_assigns.get(attribute_key(text, func.class_name), []):
                owner = model.function_holding(value)
                found = self._of(value, owner, depth + 1, seen | {text})
                if found.shown:
                    return found
        return _unknown(node, "it is the attribute `{text}`", "attribute")

    def _operation(
        self, node: cst.BinaryOperation, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        left, right = node.left, node.right
        if isinstance(node.operator, cst.Subtract):
            ceiling = number_value(left, arithmetic=True)
            if ceiling is not None:
                below = self._of(right, func, depth + 1, seen)
                if below.shown or _probability_call(right):
                    return Evidence(
                        True,
                        f"`{shorten(code_of(node))}` is 0 where `{shorten(code_of(right))}` is 1",
                        signed=True,
                    )
            return Evidence(
                True,
                f"`{shorten(code_of(node))}` is a difference, 0 where its terms are equal",
                signed=True,
            )
        if isinstance(node.operator, cst.Multiply | cst.MatrixMultiply):
            return self._any([left, right], func, depth, seen, node)
        if isinstance(node.operator, cst.Power):
            exponent = number_value(right, arithmetic=True)
            if exponent is not None and exponent <= 0:
                # `x ** -1` is never 0 (it is infinite where `x` is, a division's case).
                return _unknown(node, "`{text}` is a negative power")
            return self._of(left, func, depth + 1, seen)
        if isinstance(node.operator, cst.Divide | cst.FloorDivide):
            return self._of(left, func, depth + 1, seen)
        if isinstance(node.operator, cst.Add):
            first = self._of(left, func, depth + 1, seen)
            second = self._of(right, func, depth + 1, seen)
            if first.shown and (second.shown or first.signed):
                return first  # a signed term can cancel what it is added to
            if second.shown and second.signed:
                return second
            return first if not first.shown and (first.opaque or second.shown) else second
        return _unknown(node, "cannot tell how `{text}` is made")

    def _call(self, call: cst.Call, func: FuncInfo, depth: int, seen: frozenset[str]) -> Evidence:
        name = called_name(call)
        text = shorten(code_of(call))
        if name in PROBABILITY_CALLS:
            return Evidence(True, f"`{text}` is a probability, which rounds to 0")
        if name in ZERO_FLOORS:
            return Evidence(True, f"`{text}` is 0 for every input at or below 0")
        if name in DISTANCES:
            return Evidence(True, f"`{text}` is a distance, 0 where two rows coincide")
        if name in SPECTRA:
            return Evidence(True, f"`{text}` is a spectrum, 0 in every bin of a silent input")
        if name == "Parameter":
            return Evidence(True, f"`{text}` is trained, and nothing keeps it above 0", signed=True)
        if name in PRODUCTS:
            factors = [a.value for a in call.args if a.keyword is None]
            subject = _subject(call)
            if subject is not None and subject not in factors:
                factors.insert(0, subject)
            return self._any(factors, func, depth, seen, call)
        if name in {"clamp", "clip", "clamp_min", "clamp_"}:
            bound = clamp_bound(call, "min")
            if bound is not None and number_value(bound, arithmetic=True) == 0:
                return Evidence(True, f"`{text}` is clamped at 0")
        if name in {"where"}:
            branches = [a.value for a in call.args[1:3]]
            return self._any(branches, func, depth, seen, call)
        if name in JOINS and call.args:
            joined = call.args[0].value
            if isinstance(joined, cst.List | cst.Tuple):
                parts = [e.value for e in joined.elements if isinstance(e, cst.Element)]
                return self._any(parts, func, depth, seen, call)
        if name in FOLLOWED_CALLS or name in {"clamp", "clip", "clamp_max"}:
            subject = _subject(call)
            if subject is not None:
                found = self._of(subject, func, depth + 1, seen)
                return found
        callee = self.positivity._callee(call, func)
        if callee is not None and callee is not func and callee.returns:
            for returned in callee.returns:
                if isinstance(returned, cst.Tuple):
                    continue
                found = self._of(returned, callee, depth + 1, frozenset())
                if found.shown:
                    return found
            return _unknown(call, "nothing `{text}` returns shows a way to 0")
        head = (dotted_name(call.func) or "").split(".", 1)[0]
        if name in POSITIVE_CALLS or head in LIBRARY_HEADS:
            # A library op whose inputs showed nothing above: no way to 0 is written, and
            # no code is out of sight.
            return _unknown(call, "nothing shows how `{text}` reaches 0")
        return _unknown(call, "it comes from `{text}`", "call")


def _loop_source(func: FuncInfo, name: str) -> cst.BaseExpression | None:
    """What a loop (or a comprehension) in ``func`` takes ``name`` from."""
    for inner in walk(func.node):
        if isinstance(inner, cst.For | cst.CompFor) and any(
            isinstance(part, cst.Name) and part.value == name for part in walk(inner.target)
        ):
            return inner.iter  # `for lh in ...`, `for name, lh in d.items()`
    return None


def _empty_container(node: cst.BaseExpression) -> bool:
    """``[]``, ``{}``, ``list()``: a container filled later (``weights.append(w)``)."""
    if isinstance(node, cst.List | cst.Dict):
        return not node.elements
    return isinstance(node, cst.Call) and dotted_name(node.func) in {"list", "dict"}


def _probability_call(node: cst.BaseExpression) -> bool:
    node = Positivity._same_value(node)
    return isinstance(node, cst.Call) and called_name(node) in PROBABILITY_CALLS


def _subject(call: cst.Call) -> cst.BaseExpression | None:
    """The tensor a call works on: ``x`` in ``x.sum()`` or ``torch.sum(x)``."""
    if isinstance(call.func, cst.Attribute):
        head = dotted_name(call.func.value)
        if head not in {"torch", "th", "F", "np", "numpy", "math", "torch.linalg", "linalg"}:
            return call.func.value
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return None
