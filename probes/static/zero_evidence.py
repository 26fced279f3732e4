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

``1 - x`` shows a way to 0 only where ``x`` is shown reaching 1 (:meth:`ZeroEvidence._reaches_one`).
A way to 0 is half the evidence: :meth:`ZeroEvidence.gradient` asks whether the code shows a
gradient flowing through the value (a model's output, a trained parameter, a loss's
prediction), and :meth:`ZeroEvidence.target_only` whether a denominator is made from the
target alone (only the data decides whether a target is all 0).

``unstable-loss-op`` warns on shown evidence only; unknown provenance is an info at most."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import libcst as cst

from gradient_doctor.probes.static.model import FuncInfo, attribute_key, bind_arguments
from gradient_doctor.probes.static.names import code_of, dotted_name, number_value
from gradient_doctor.probes.static.positivity import (
    DETACHED_ATTRIBUTES,
    DETACHING_CALLS,
    JOINS,
    LIBRARY_HEADS,
    MAX_DEPTH,
    NORMS,
    POSITIVE_CALLS,
    SAMPLED_OR_CONSTANT,
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


BELOW_ONE = "<below one>"
"""``Evidence.source`` of a value the code keeps below 1 (a clamp's maximum)."""
REACHING_ONE = frozenset({"tanh", "cos", "cosine_similarity", "softsign", "hardtanh"})
"""Calls whose value reaches 1 (``tanh`` rounds to exactly 1 in float32 past ~9)."""
PREDICTION_WORDS = frozenset(
    {"pred", "preds", "prediction", "predictions", "predicted", "logit", "logits", "output"}
    | {"outputs", "out", "score", "scores", "hat", "recon", "reconstruction", "estimate"}
    | {"fake", "generated", "student", "energy", "energies", "sim", "similarity", "dist"}
    | {"distance", "distances", "emb", "embedding", "embeddings", "feat", "feats", "features"}
    | {"z", "mu", "mean", "std", "sigma", "var", "logvar", "log_var", "weights", "weight"}
    | PROBABILITY_WORDS
)
"""Name parts that say an argument of a loss holds the network's prediction (or a value
the network makes: an embedding, a distribution's parameters)."""
TRAINED_ATTRIBUTES = frozenset({"weight", "bias"})
"""A module's attributes that are trained parameters."""
BUILTINS = frozenset({"sum", "min", "max", "abs", "list", "tuple", "zip", "enumerate", "map"})
MODEL_WORDS = frozenset(
    {"model", "net", "network", "module", "encoder", "decoder", "policy", "actor", "critic"}
    | {"generator", "discriminator", "head", "backbone", "vae", "unet"}
)


def prediction_name(name: str) -> bool:
    """``pred``, ``cls_logits``, ``x_hat``, ``probs``: an argument of a loss named as the
    network's prediction (or a value the network makes)."""
    parts = [part for part in name.lower().split("_") if part]
    return any(part in PREDICTION_WORDS for part in parts)


def _model_name(name: str) -> bool:
    parts = [part for part in name.lower().split("_") if part]
    return any(part in MODEL_WORDS for part in parts)


def _named_probability(name: str) -> Evidence | None:
    if probability_name(name):
        return Evidence(True, f"`{name}` is named as a probability, which can be 1")
    return None


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
        found = self._from_callers(name, func, depth, self._of)
        if found is not None:
            return found
        return Evidence(
            False,
            f"it is the parameter `{name}`, and no caller in this file shows what it holds",
            name,
            "parameter",
        )

    def _from_callers(
        self,
        name: str,
        func: FuncInfo,
        depth: int,
        ask: Callable[[cst.BaseExpression, FuncInfo, int, frozenset[str]], Evidence],
    ) -> Evidence | None:
        """The first caller in the file whose argument for the parameter ``name`` shows
        ``ask``'s property, as evidence that quotes that argument; None when none does."""
        node = func.node
        if not isinstance(node, cst.FunctionDef) or depth >= MAX_DEPTH:
            return None
        for call, caller in self._callers(func):
            argument = dict(bind_arguments(call, node)).get(name)
            if argument is None:
                continue
            found = ask(argument, caller, depth + 1, frozenset())
            if found.shown:
                return Evidence(
                    True,
                    f"a caller passes `{shorten(code_of(argument))}` as `{name}`: {found.reason}",
                )
        return None

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
                # `1 - x` is 0 only where `x` reaches 1: a probability the code shows (a
                # sigmoid, a softmax, a name that says so), not any value of unseen making.
                reaches = self._reaches_one(right, func, depth + 1, seen) if ceiling == 1 else None
                if reaches is not None and reaches.shown:
                    return Evidence(
                        True,
                        f"`{shorten(code_of(node))}` is 0 where `{shorten(code_of(right))}` is 1"
                        f" ({reaches.reason})",
                        signed=True,
                    )
                if reaches is not None and (reaches.opaque or reaches.source == BELOW_ONE):
                    # Made out of sight (a `pred` argument): info; clamped below 1: silent.
                    return Evidence(
                        False,
                        f"`{shorten(code_of(node))}` is 0 only where `{shorten(code_of(right))}`"
                        f" is 1, and {reaches.reason}",
                        reaches.source,
                        reaches.leaf,
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

    # -- reaching 1 ------------------------------------------------------------------------------
    def _reaches_one(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        """Whether the code shows ``node`` reaching 1 (what makes ``1 - node`` 0): a
        probability (``sigmoid``, ``softmax``: they round to exactly 1 as well as 0), a
        ``tanh`` or a cosine, a name that says probability, and these through selections,
        reshapes, reductions and powers; a clamp whose maximum is below 1 never does."""
        node = Positivity._same_value(node)
        if depth > MAX_DEPTH:
            return _unknown(node, "cannot follow `{text}` further")
        value = number_value(node, arithmetic=True)
        if value is not None:
            return Evidence(True, "it is 1") if value == 1 else _unknown(node, "`{text}` is not 1")
        if isinstance(node, cst.Name | cst.Attribute):
            reaching = reaching_value(func.model or self.model, node)
            if reaching is not None and not _empty_container(reaching):
                found = self._reaches_one(reaching, func, depth + 1, seen | {code_of(node)})
                if isinstance(node, cst.Name) and found.opaque and found.leaf == "call":
                    return _named_probability(node.value) or found
                return found
        if isinstance(node, cst.Name):
            return self._name_reaches_one(node, func, depth, seen)
        if isinstance(node, cst.Attribute):
            text = dotted_name(node)
            model = func.model or self.model
            if text is not None and text not in seen:
                for assigned in model.attribute_assigns.get(
                    attribute_key(text, func.class_name), []
                ):
                    owner = model.function_holding(assigned)
                    found = self._reaches_one(assigned, owner, depth + 1, seen | {text})
                    if found.shown:
                        return found
            return _named_probability(node.attr.value) or _unknown(
                node, "it is the attribute `{text}`", "attribute"
            )
        if isinstance(node, cst.Subscript):
            return self._reaches_one(node.value, func, depth + 1, seen)
        if isinstance(node, cst.BinaryOperation):
            exponent = number_value(node.right, arithmetic=True)
            if isinstance(node.operator, cst.Power) and exponent is not None and exponent > 0:
                return self._reaches_one(node.left, func, depth + 1, seen)
            parts = [
                self._reaches_one(part, func, depth + 1, seen) for part in (node.left, node.right)
            ]
            if isinstance(node.operator, cst.Multiply) and all(f.shown for f in parts):
                # `p * mask`: 1 where both factors are.
                return Evidence(True, f"every factor of `{shorten(code_of(node))}` reaches 1")
            opaque = [f for f in parts if f.opaque]
            return opaque[0] if opaque else _unknown(node, "nothing shows `{text}` reaching 1")
        if isinstance(node, cst.Call):
            return self._call_reaches_one(node, func, depth, seen)
        return _unknown(node, "nothing shows `{text}` reaching 1")

    def _name_reaches_one(
        self, node: cst.Name, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        name = node.value
        values = [
            v
            for v in func.assigns.get(name, [])
            if not (isinstance(own := Positivity._same_value(v), cst.Name) and own.value == name)
        ]
        values = [] if name in seen else self._before(node, values, func)
        opaque: Evidence | None = None
        for inner in values:
            found = self._reaches_one(inner, func, depth + 1, seen | {name})
            if found.shown:
                return found
            if opaque is None and found.opaque:
                opaque = found
        if values and opaque is None:
            return _unknown(node, "nothing `{text}` is assigned reaches 1")
        if name in func.params and not values:
            named = _named_probability(name)
            if named is not None:
                return named
            if setting_parameter(func, name):
                return _unknown(node, "`{text}` is a setting")
            passed = self._from_callers(name, func, depth, self._reaches_one)
            if passed is not None:
                return passed
            return Evidence(
                False,
                f"it is the parameter `{name}`, and nothing in this file shows it holding "
                "a probability",
                name,
                "parameter",
            )
        if opaque is not None:
            return _named_probability(name) or opaque
        module = (func.model or self.model).module_info
        constants = module.assigns.get(name, []) if module is not func else []
        if len(constants) == 1:
            return self._reaches_one(constants[0], module, depth + 1, seen | {name})
        return _named_probability(name) or _unknown(
            node, "`{text}` is a loop variable or a global", "name"
        )

    def _call_reaches_one(
        self, call: cst.Call, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        name = called_name(call)
        text = shorten(code_of(call))
        if name in PROBABILITY_CALLS:
            return Evidence(True, f"`{text}` is a probability, which rounds to 1")
        if name in REACHING_ONE:
            return Evidence(True, f"`{text}` reaches 1")
        if name == "Parameter":
            return Evidence(True, f"`{text}` is trained, and nothing keeps it below 1")
        if name in {"clamp", "clip", "clamp_max", "clamp_"}:
            bound = clamp_bound(call, "max")
            if bound is not None:
                ceiling = self._number(bound, func)
                if ceiling is not None and ceiling < 1:
                    return Evidence(False, f"`{text}` is clamped below 1", BELOW_ONE)
        if name in FOLLOWED_CALLS or name in {"clamp", "clip", "clamp_max", "clamp_", "min"}:
            subject = _subject(call)
            if subject is not None:
                return self._reaches_one(subject, func, depth + 1, seen)
        callee = self.positivity._callee(call, func)
        if callee is not None and callee is not func and callee.returns:
            for returned in callee.returns:
                if isinstance(returned, cst.Tuple):
                    continue
                found = self._reaches_one(returned, callee, depth + 1, frozenset())
                if found.shown:
                    return found
            return _unknown(call, "nothing `{text}` returns reaches 1")
        head = (dotted_name(call.func) or "").split(".", 1)[0]
        if head in LIBRARY_HEADS:
            return _unknown(call, "nothing shows `{text}` reaching 1")
        return _unknown(call, "it comes from `{text}`", "call")

    def _number(self, node: cst.BaseExpression, func: FuncInfo) -> float | None:
        """A number written in place or bound once to a module constant (``max_eps``)."""
        value = number_value(node, arithmetic=True)
        if value is not None or not isinstance(node, cst.Name):
            return value
        module = (func.model or self.model).module_info
        local = func.assigns.get(node.value, []) if module is not func else []
        constants = module.assigns.get(node.value, [])
        if not local and len(constants) == 1:
            return number_value(constants[0], arithmetic=True)
        return None

    # -- gradient -----------------------------------------------------------------------------
    def gradient(self, node: cst.BaseExpression, func: FuncInfo) -> Evidence:
        """Whether the code shows a gradient flowing through ``node``: it is made from a
        model's output (a call of a module, a callable argument, a method of ``self`` the
        analyser cannot read), a trained ``nn.Parameter`` (a module's ``weight``), or a
        loss function's prediction (a parameter named as one, or one whose callers pass
        such values). ``shown`` False says what is not known (``leaf``: ``parameter`` for an
        argument of unseen provenance) or, with no leaf, that nothing carries a gradient."""
        return self._gradient(node, func, 0, frozenset())

    def _gradient(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        # Only definitions, callers and callees count depth: the tree bounds the rest.
        if depth > 2 * MAX_DEPTH:
            return _unknown(node, "cannot follow `{text}` further")
        if number_value(node, arithmetic=True) is not None or isinstance(
            node, cst.Comparison | cst.SimpleString | cst.ConcatenatedString
        ):
            return _unknown(node, "`{text}` is a constant")
        if isinstance(node, cst.Name | cst.Attribute):
            reaching = reaching_value(func.model or self.model, node)
            if reaching is not None and not _empty_container(reaching):
                return self._gradient(reaching, func, depth + 1, seen | {code_of(node)})
        if isinstance(node, cst.Name):
            return self._name_gradient(node, func, depth, seen)
        if isinstance(node, cst.Attribute):
            return self._attribute_gradient(node, func, depth, seen)
        if isinstance(node, cst.Subscript):
            return self._gradient(node.value, func, depth, seen)
        if isinstance(node, cst.UnaryOperation):
            return self._gradient(node.expression, func, depth, seen)
        if isinstance(node, cst.BinaryOperation):
            return self._gradient_any([node.left, node.right], func, depth, seen, node)
        if isinstance(node, cst.IfExp):
            return self._gradient_any([node.body, node.orelse], func, depth, seen, node)
        if isinstance(node, cst.List | cst.Tuple):
            elements = [e.value for e in node.elements if isinstance(e, cst.Element)]
            return self._gradient_any(elements, func, depth, seen, node)
        if isinstance(node, cst.Call):
            return self._call_gradient(node, func, depth, seen)
        return _unknown(node, "cannot tell how `{text}` is made", "name")

    def _gradient_any(
        self,
        nodes: list[cst.BaseExpression],
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        whole: cst.BaseExpression,
    ) -> Evidence:
        opaque: Evidence | None = None
        for inner in nodes:
            found = self._gradient(inner, func, depth, seen)
            if found.shown:
                return found
            if opaque is None and found.opaque:
                opaque = found
        return opaque or _unknown(whole, "nothing in `{text}` carries a gradient")

    def _name_gradient(
        self, node: cst.Name, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        name = node.value
        values = [
            v
            for v in func.assigns.get(name, [])
            if not (isinstance(own := Positivity._same_value(v), cst.Name) and own.value == name)
        ]
        values = [] if name in seen else self._before(node, values, func)
        if values:
            return self._gradient_any(values, func, depth + 1, seen | {name}, node)
        if name in func.params:
            return self._parameter_gradient(name, func, depth)
        module = (func.model or self.model).module_info
        constants = module.assigns.get(name, []) if module is not func else []
        if len(constants) == 1:
            return self._gradient(constants[0], module, depth + 1, seen | {name})
        source = _loop_source(func, name)
        if source is not None:
            return self._gradient(source, func, depth + 1, seen | {name})
        return _unknown(node, "`{text}` is a global", "name")

    def _parameter_gradient(self, name: str, func: FuncInfo, depth: int) -> Evidence:
        """An argument carries a gradient when a caller in the file passes one that does;
        with no caller in the file, when its name says it is a prediction (``pred``,
        ``logits``, ``probs``, ``output``) or a callable argument builds it."""
        node = func.node
        passed = False
        if isinstance(node, cst.FunctionDef) and depth < MAX_DEPTH:
            for call, caller in self._callers(func):
                argument = dict(bind_arguments(call, node)).get(name)
                if argument is None:
                    continue
                passed = True
                found = self._gradient(argument, caller, depth + 1, frozenset())
                if found.shown:
                    return Evidence(
                        True,
                        f"a caller passes `{shorten(code_of(argument))}` as `{name}`: "
                        f"{found.reason}",
                    )
        if not passed and prediction_name(name):
            return Evidence(True, f"`{name}` is named as a prediction")
        if not passed and isinstance(node, cst.FunctionDef) and _first_argument(node) == name:
            # What a loss (or a function it calls) is given first is, by convention, what
            # the network predicted: `forward(self, q, k)`, `loss(a, b)`.
            return Evidence(True, f"`{name}` is the first argument, the prediction")
        return Evidence(
            False,
            f"it is made from the argument `{name}`, and nothing in this file shows a "
            "gradient flowing through it",
            name,
            "parameter",
        )

    def _attribute_gradient(
        self, node: cst.Attribute, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        attribute = node.attr.value
        if attribute in DETACHED_ATTRIBUTES:
            return _unknown(node, "`{text}` is detached")
        if attribute in TRAINED_ATTRIBUTES:
            return Evidence(True, f"`{shorten(code_of(node))}` is trained")
        text = dotted_name(node)
        model = func.model or self.model
        if text is not None and text.startswith("self.") and text not in seen:
            opaque: Evidence | None = None
            for value in model.attribute_assigns.get(attribute_key(text, func.class_name), []):
                owner = model.function_holding(value)
                found = self._gradient(value, owner, depth + 1, seen | {text})
                if found.shown:
                    return found
                if opaque is None and found.opaque:
                    opaque = found
            if opaque is not None:
                return opaque
            return _unknown(node, "it is the attribute `{text}`", "attribute")
        if text is None or not text.startswith("self."):
            return self._gradient(node.value, func, depth, seen)
        return _unknown(node, "it is the attribute `{text}`", "attribute")

    def _call_gradient(
        self, call: cst.Call, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> Evidence:
        name = called_name(call)
        text = shorten(code_of(call))
        if name == "Parameter":
            return Evidence(True, f"`{text}` is trained")
        if name in DETACHING_CALLS or name in SAMPLED_OR_CONSTANT:
            return _unknown(call, "`{text}` carries no gradient")
        callee = self.positivity._callee(call, func)
        if callee is not None and callee is not func and callee.returns:
            node = callee.node
            bound = dict(bind_arguments(call, node)) if isinstance(node, cst.FunctionDef) else {}
            opaque: Evidence | None = None
            for returned in callee.returns:
                found = self._gradient(returned, callee, depth + 1, frozenset())
                if found.shown:
                    return found
                if found.leaf == "parameter" and found.source in bound:
                    # The callee computes from an argument: what this call passes decides.
                    found = self._gradient(bound[found.source], func, depth + 1, seen)
                    if found.shown:
                        return found
                if opaque is None and found.opaque:
                    opaque = found
            return opaque or _unknown(call, "nothing `{text}` returns carries a gradient")
        target = call.func
        dotted = dotted_name(target) or ""
        head = dotted.split(".", 1)[0]
        arguments = [a.value for a in call.args]
        if head in LIBRARY_HEADS or head in BUILTINS:
            return self._gradient_any(arguments, func, depth, seen, call)
        if isinstance(target, cst.Name):
            if target.value in func.params or _model_name(target.value):
                return Evidence(True, f"`{text}` is a model's output")
            found = self._gradient_any(arguments, func, depth, seen, call)
            return found if found.shown else _unknown(call, "it comes from `{text}`", "call")
        if isinstance(target, cst.Attribute):
            if dotted.startswith("self.") or _model_name(head):
                return Evidence(True, f"`{text}` is a model's output")
            # A tensor's method (`x.sum(1)`, `b.cumprod(0)`): its tensor and arguments decide.
            return self._gradient_any([target.value, *arguments], func, depth, seen, call)
        return Evidence(True, f"`{text}` is a model's output")

    # -- the target ---------------------------------------------------------------------------
    def target_only(self, node: cst.BaseExpression, func: FuncInfo) -> str | None:
        """The target argument ``node`` is built from alone (with settings and numbers):
        ``y_mag`` for ``torch.norm(y_mag, p=1)`` in ``forward(self, x_mag, y_mag)``, ``target``
        for a spectrum of ``target``. Whether a target is ever all 0 (a silent clip, an empty
        label map) only the data decides. None when anything else goes in."""
        found: set[str] = set()
        if self._target_only(node, func, 0, frozenset(), found) and found:
            return sorted(found)[0]
        return None

    def _target_only(
        self,
        node: cst.BaseExpression,
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        found: set[str],
    ) -> bool:
        if depth > MAX_DEPTH:
            return False
        if number_value(node, arithmetic=True) is not None or isinstance(
            node, cst.SimpleString | cst.ConcatenatedString
        ):
            return True

        def only(inner: cst.BaseExpression) -> bool:
            return self._target_only(inner, func, depth + 1, seen, found)

        if isinstance(node, cst.Name):
            name = node.value
            if name in seen:
                return True
            values = [
                v
                for v in self._before(node, func.assigns.get(name, []), func)
                if not (
                    isinstance(own := Positivity._same_value(v), cst.Name) and own.value == name
                )
            ]
            if values:
                return all(
                    self._target_only(v, func, depth + 1, seen | {name}, found) for v in values
                )
            if name in func.params and _target_parameter(name, func):
                found.add(name)
                return True
            return name in {"True", "False", "None"}
        if isinstance(node, cst.Attribute):
            # `self.fb`, `target.shape`: settings and properties (a target's own method is
            # a call, read below).
            return (dotted_name(node) or "").startswith("self.") or only(node.value)
        if isinstance(node, cst.Subscript):
            return only(node.value)
        if isinstance(node, cst.UnaryOperation):
            return only(node.expression)
        if isinstance(node, cst.BinaryOperation):
            return only(node.left) and only(node.right)
        if isinstance(node, cst.List | cst.Tuple):
            return all(isinstance(e, cst.Element) and only(e.value) for e in node.elements)
        if isinstance(node, cst.Call):
            parts = [a.value for a in call_args(node)]
            if isinstance(node.func, cst.Attribute) and not (
                dotted_name(node.func.value) or ""
            ).startswith("self"):
                head = (dotted_name(node.func) or "").split(".", 1)[0]
                if head not in LIBRARY_HEADS:
                    parts.insert(0, node.func.value)
            return all(only(part) for part in parts)
        return False


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


TARGET_WORDS = frozenset(
    {"target", "targets", "tgt", "gt", "label", "labels", "truth", "groundtruth", "ref"}
    | {"reference", "clean"}
)
"""Name parts that say an argument holds the target (the data a prediction is scored on)."""


def _target_parameter(name: str, func: FuncInfo) -> bool:
    """``target``, ``gt_boxes``, ``ref_mag``; also ``y_mag`` beside ``x_mag`` (and ``y``
    beside ``x``): the input/target pair of a loss's ``forward(x, y)``."""
    parts = [part for part in name.lower().split("_") if part]
    if any(part in PREDICTION_WORDS for part in parts):
        return False
    if any(part in TARGET_WORDS for part in parts):
        return True
    if parts and parts[0] == "y":
        return "_".join(["x", *parts[1:]]) in func.params
    return False


def call_args(call: cst.Call) -> list[cst.Arg]:
    """The arguments of ``call`` (keyword ones included)."""
    return list(call.args)


def _first_argument(node: cst.FunctionDef) -> str | None:
    """The first positional parameter after ``self`` / ``cls``."""
    params = [*node.params.posonly_params, *node.params.params]
    names = [p.name.value for p in params]
    if names and names[0] in {"self", "cls"}:
        names = names[1:]
    return names[0] if names else None


def setting_parameter(func: FuncInfo, name: str) -> bool:
    """``name`` is a parameter with a number for its default (``min_bin=1e-3``): a setting."""
    node = func.node
    if not isinstance(node, cst.FunctionDef):
        return False
    for param in [*node.params.posonly_params, *node.params.params, *node.params.kwonly_params]:
        if param.name.value == name and param.default is not None:
            return number_value(param.default, arithmetic=True) is not None
    return False
