"""Where the backpropagated loss comes from: is it divided by the accumulation count?

Only two things count as accumulation scaling: a division by the number of micro-batches
``N`` (or a multiplication by ``1 / N``), and a division by the token count of the whole
accumulation window (a count computed before the micro-batches run, or Hugging Face's
``num_items_in_batch``). Everything else is not: ``l1 + w * l2``, ``loss * 0.5``,
``tok_loss.sum() / n_tokens`` where ``n_tokens`` counts this micro-batch only, a division by
the world size or a temperature. When the analyser cannot tell (a division by a name whose
meaning it cannot see), the answer is ``unknown`` and the rules stay silent.

The loss is followed through assignments (the value that reaches ``backward()``), in-place
``/=`` and ``*=``, tensor methods (``.mean()``), attributes and items (``outputs.loss``), local
and project helpers (their ``return`` values), and back out through the helper calls that led
to the ``backward()`` (a loss passed as an argument keeps its history).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

import libcst as cst

from gradient_doctor.probes.static.model import (
    Accumulation,
    Event,
    FileModel,
    FuncInfo,
    HelperCall,
    attribute_key,
    bind_arguments,
    keyed_place,
)
from gradient_doctor.probes.static.names import (
    code_of,
    dotted_name,
    method_name,
    number_value,
)
from gradient_doctor.probes.static.ruletools import TENSOR_METHODS as RULE_TENSOR_METHODS
from gradient_doctor.probes.static.traverse import walk

Verdict = Literal["accumulation", "none", "unknown"]

ACCUMULATION_WORDS = re.compile(
    r"accum|grad_acc|gradient_acc|accumulat|n_?micro|num_?micro|micro_?batches|micro_?steps"
    r"|update_freq|iters_to_accumulate|backward_passes|(?:^|[._])gas(?:$|_)|grad_steps"
    r"|batch_multiplier|n_?acc\b|num_acc",
    re.I,
)
WINDOW_TOKEN_WORDS = re.compile(
    r"num_items_in_batch|items_in_batch|window|global\w*tok|step_tok", re.I
)
BATCH_STATISTIC = re.compile(
    r"\.sum\(|\.numel\(|len\(|\.size\(|\.shape|mask|token|batch_size|\bbs\b|world_size|"
    r"temperature|\btemp\b|\.count|n_?valid|num_?valid|denom|norm|std|\bn_?samples?\b",
    re.I,
)
TOKEN_WORDS = re.compile(r"tok|mask|items|non_?pad|n_?valid|num_?valid|\.ne\(|!=", re.I)
"""What names a count of real tokens (``n_tokens``, ``mask.sum()``, ``(labels != pad).sum()``)."""
DATA_STATISTIC = re.compile(r"\.sum\(|\.numel\(|\.shape|\.size\(|len\(|count_nonzero|\[", re.I)
"""A value read off the data (a sum, a shape, an item of the batch), not a setting."""
POSITION_READS = re.compile(r"\.shape\s*\[[^\]]*\]|\.shape\b|\.size\([^)]*\)|\.numel\(\s*\)")
"""Reads of a tensor's size: they count padded positions, the same for equal-shaped batches."""
REAL_COUNT = re.compile(r"\.sum\(|count_nonzero|\.ne\(|!=|\[|len\(", re.I)
"""What, once the size reads are set aside, counts real tokens: a sum of a mask, a comparison
with the pad id, an item of the batch (``batch["num_tokens"]``), a length."""
TokenCount = Literal["real", "positions"]
WEIGHT_WORDS = re.compile(r"weight|lambda|\blam|alpha|beta|gamma|coef|\bw\d*\b|_w\b|ratio", re.I)
# The tensor methods the rules look through (dtype/device moves, reductions, reshapes), less
# `dict.get` (a batch item is read as a count here, not passed through), plus the shape methods
# a loss takes on its way to a token count.
TENSOR_METHODS = (RULE_TENSOR_METHODS - {"get"}) | {"flatten", "type_as", "unsqueeze"}
MAX_DEPTH = 20


@dataclass
class Scaling:
    """How the backpropagated loss is scaled with respect to gradient accumulation."""

    verdict: Verdict
    node: cst.CSTNode | None = None
    """The division (or multiplication) by the accumulation count, when there is one."""
    divisor: str | None = None
    reason: str = ""
    """For ``unknown``: what the analyser could not follow."""
    others: list[str] = field(default_factory=list)
    """Divisions and products that are not accumulation scaling (for messages)."""
    by_counter: bool = False
    """The loss is divided by the running micro-step counter instead of N."""
    token_mean: cst.CSTNode | None = None
    """The division of the loss by the token count of its own micro-batch (a per-micro-batch
    token mean), wherever it is written: in the loop, or in a helper of another file."""
    token_mean_in: FuncInfo | None = None
    """The function that holds ``token_mean``."""
    summed: bool = False
    """For ``unknown``: only because a loss is summed (``reduction='sum'``), which may be
    normalised elsewhere."""
    divided_path: Scaling | None = None
    """For ``unknown`` because only some paths divide: the scaling of a path that divides by
    the accumulation count (a rule judged per path may still read it)."""


@dataclass(frozen=True)
class _Context:
    """A function being read, and how its parameters were bound by the call that led here."""

    func: FuncInfo
    bindings: dict[str, tuple[cst.BaseExpression, _Context | None]]


def loss_scaling(
    model: FileModel,
    backward: Event,
    accumulation: Accumulation | None,
    root: FuncInfo,
    micro: cst.CSTNode | None = None,
) -> Scaling:
    """How the loss of ``backward`` is scaled. ``root`` is the function whose loop holds the
    backward (directly or through helper calls); ``micro`` is the micro-step loop (a count
    assigned inside it belongs to one micro-batch, one assigned before it to the window)."""
    reader = _Reader(model, accumulation, micro)
    context = reader.context_of(backward, root)
    if backward.loss is None:
        return Scaling("unknown", reason="the backpropagated value is not visible")
    return reader.expression(backward.loss, context, 0)


def loss_origin(model: FileModel, backward: Event, root: FuncInfo) -> cst.CSTNode | None:
    """The statement that computed the backpropagated loss with a call the analyser does not
    look into (the forward pass: ``loss = model(batch)``), followed through assignments,
    arithmetic and the helper calls that led to the backward; None when it cannot tell."""
    reader = _Reader(model, None, None)
    if backward.loss is None:
        return None
    return reader.origin(backward.loss, reader.context_of(backward, root), 0)


def value_scaling(
    model: FileModel,
    func: FuncInfo,
    expr: cst.BaseExpression,
    divisor: str | None = None,
) -> Scaling:
    """How ``expr`` (a value of ``func``, such as what ``training_step`` returns) is scaled;
    ``divisor`` is the accumulation count when the configuration names one."""
    reader = _Reader(model, None, None)
    reader.divisor_text = divisor
    return reader.expression(expr, _Context(func, {}), 0)


def _combine_terms(parts: list[Scaling]) -> Scaling:
    """A sum of terms is scaled when every term is; unscaled when none is."""
    if not parts:
        return Scaling("none")
    unknown = next((p for p in parts if p.verdict == "unknown"), None)
    if unknown is not None:
        return _with_token_mean(unknown, parts, every=False)
    scaled = [p for p in parts if p.verdict == "accumulation"]
    others = [o for p in parts for o in p.others]
    if len(scaled) == len(parts):
        combined = Scaling("accumulation", scaled[0].node, scaled[0].divisor, others=others)
    elif not scaled:
        combined = Scaling("none", others=others, by_counter=any(p.by_counter for p in parts))
    else:
        combined = Scaling("unknown", reason="only some terms of the loss are divided by N")
    # A token-mean term keeps its per-micro-batch weighting whatever is added to it.
    return _with_token_mean(combined, parts, every=False)


def _with_token_mean(result: Scaling, parts: list[Scaling], *, every: bool) -> Scaling:
    """``result`` marked as a per-micro-batch token mean when any (or ``every``) part is."""
    means = [p for p in parts if p.token_mean is not None]
    if not means or (every and len(means) != len(parts)) or result.token_mean is not None:
        return result
    return replace(result, token_mean=means[0].token_mean, token_mean_in=means[0].token_mean_in)


def _either(parts: list[Scaling]) -> Scaling:
    """One of several values reaches the backward: a verdict only when they all agree."""
    if not parts:
        return Scaling("unknown", reason="no value")
    verdicts = {p.verdict for p in parts}
    if verdicts == {"none", "unknown"} and all(p.summed for p in parts if p.verdict == "unknown"):
        # `mean_loss if steady else summed_warmup_loss`: the path with the plain mean is not
        # divided by N whatever normalises the summed one (learned from leads1 wheatley).
        result = next(p for p in parts if p.verdict == "none")
    elif len(verdicts) == 1:
        result = parts[0]
    else:
        unknown = next((p for p in parts if p.verdict == "unknown"), None)
        result = unknown or Scaling("unknown", reason="the loss is divided by N on some paths only")
        divided = next((p for p in parts if p.verdict == "accumulation"), None)
        if divided is not None and divided.node is not None:
            result = replace(result, divided_path=divided)
    # A token mean on every path (each branch of a loss helper normalises the same way).
    result = replace(result, token_mean=None, token_mean_in=None)
    return _with_token_mean(result, parts, every=True)


class _Reader:
    def __init__(
        self, model: FileModel, accumulation: Accumulation | None, micro: cst.CSTNode | None
    ) -> None:
        self.model = model
        self.accumulation = accumulation
        self.micro = micro
        self.divisor_text = (
            code_of(accumulation.divisor)
            if accumulation is not None and accumulation.divisor is not None
            else None
        )
        self.counter = accumulation.counter if accumulation is not None else None

    def context_of(self, event: Event, root: FuncInfo) -> _Context:
        context = _Context(root if event.chain else event.func, {})
        for helper in event.chain:
            context = self._enter(helper, context)
        return context

    def _enter(self, helper: HelperCall, outer: _Context) -> _Context:
        target = helper.target
        bindings: dict[str, tuple[cst.BaseExpression, _Context | None]] = {}
        if isinstance(target.node, cst.FunctionDef):
            owner = outer.func.model or self.model
            preset = owner.partial_of(helper.call, outer.func)
            for param, value in bind_arguments(helper.call, target.node, preset):
                bindings[param] = (value, outer)
        return _Context(target, bindings)

    # -- expressions -------------------------------------------------------------------------
    def expression(self, expr: cst.BaseExpression, context: _Context, depth: int) -> Scaling:
        if depth > MAX_DEPTH:
            return Scaling("unknown", reason="the loss goes through too many steps to follow")
        if isinstance(expr, cst.BinaryOperation):
            return self._binary(expr, context, depth)
        if isinstance(expr, cst.UnaryOperation):
            return self.expression(expr.expression, context, depth + 1)
        if isinstance(expr, cst.Name):
            return self._name(expr.value, expr, context, depth)
        if isinstance(expr, cst.Attribute):
            if isinstance(expr.value, cst.Name) and expr.value.value in {"self", "cls"}:
                return Scaling("unknown", reason=f"`{code_of(expr)}` is set elsewhere")
            return self.expression(expr.value, context, depth + 1)
        if isinstance(expr, cst.Subscript):
            place = keyed_place(expr)
            if place is not None and context.func.assign_sites.get(place):
                return self._name(place, expr, context, depth)
            return self.expression(expr.value, context, depth + 1)
        if isinstance(expr, cst.Call):
            return self._call(expr, context, depth)
        if isinstance(expr, cst.IfExp):
            return _either(
                [
                    self.expression(expr.body, context, depth + 1),
                    self.expression(expr.orelse, context, depth + 1),
                ]
            )
        if isinstance(expr, cst.Integer | cst.Float):
            return Scaling("none")
        return Scaling("unknown", reason=f"`{_short(expr)}` is not followed")

    def _binary(self, expr: cst.BinaryOperation, context: _Context, depth: int) -> Scaling:
        operator = expr.operator
        if isinstance(operator, cst.Add | cst.Subtract):
            return _combine_terms(
                [
                    self.expression(expr.left, context, depth + 1),
                    self.expression(expr.right, context, depth + 1),
                ]
            )
        if isinstance(operator, cst.Divide):
            base = self.expression(expr.left, context, depth + 1)
            return self._divided(base, expr.right, expr, context, depth)
        if isinstance(operator, cst.Multiply):
            left_factor = self.factor(expr.left, context, depth)
            right_factor = self.factor(expr.right, context, depth)
            if left_factor == "accumulation" or right_factor == "accumulation":
                other = expr.right if left_factor == "accumulation" else expr.left
                base = self.expression(other, context, depth + 1)
                return self._scaled(base, "accumulation", expr)
            if right_factor in {"weight", "constant"}:
                return self._scaled(self.expression(expr.left, context, depth + 1), "other", expr)
            if left_factor in {"weight", "constant"}:
                return self._scaled(self.expression(expr.right, context, depth + 1), "other", expr)
            left = self.expression(expr.left, context, depth + 1)
            right = self.expression(expr.right, context, depth + 1)
            if left.verdict == "accumulation" or right.verdict == "accumulation":
                return left if left.verdict == "accumulation" else right
            if "unknown" in {left.verdict, right.verdict}:
                return Scaling("unknown", reason=f"the product `{_short(expr)}` is not followed")
            return Scaling("none", others=[*left.others, *right.others, _short(expr)])
        return Scaling("unknown", reason=f"`{_short(expr)}` is not followed")

    def _scaled(self, base: Scaling, factor: str, node: cst.CSTNode) -> Scaling:
        return _with_token_mean(self._scaled_value(base, factor, node), [base], every=True)

    def _divided(
        self,
        base: Scaling,
        denominator: cst.BaseExpression,
        node: cst.CSTNode,
        context: _Context,
        depth: int,
    ) -> Scaling:
        """``base`` divided by ``denominator``; a division by this micro-batch's token count
        makes the loss a per-micro-batch token mean, whatever the helper is called."""
        factor = self.divisor(denominator, context, depth)
        if factor == "accumulation" and base.verdict != "accumulation":
            numerator = _numerator(node)
            if numerator is not None and self._multiplied_by_count(numerator):
                # `loss * N / window_tokens` (the transformers Trainer recipe): the product
                # undoes the framework's own division by N, so the quotient is no
                # accumulation scaling of its own.
                return Scaling("none", others=[*base.others, _short(node)])
        result = self._scaled(base, factor, node)
        if (
            factor != "accumulation"
            and base.verdict != "accumulation"
            and result.token_mean is None
            and self._micro_batch_tokens(denominator, context, 0, named=False)
        ):
            result = replace(result, token_mean=node, token_mean_in=context.func)
        return result

    def _scaled_value(self, base: Scaling, factor: str, node: cst.CSTNode) -> Scaling:
        if factor == "accumulation":
            if base.verdict == "unknown":
                return Scaling("accumulation", node, self.divisor_text, reason=base.reason)
            return Scaling("accumulation", node, self.divisor_text, others=base.others)
        if factor == "unknown":
            if base.verdict == "accumulation":
                return base
            return Scaling("unknown", reason=f"cannot tell what `{_short(node)}` divides by")
        if base.verdict == "unknown":
            return base
        if base.verdict == "accumulation":
            return base
        return Scaling(
            "none",
            others=[*base.others, _short(node)],
            by_counter=base.by_counter or factor == "counter",
        )

    def _call(
        self, call: cst.Call, context: _Context, depth: int, element: int | None = None
    ) -> Scaling:
        """``element``: the call returns a tuple and the loss is that item of it."""
        name = method_name(call)
        func = call.func
        qualified = (context.func.model or self.model).qualify(func) or ""
        if qualified in {"typing.cast", "typing_extensions.cast"} and len(call.args) == 2:
            # `cast(torch.Tensor, loss / N)` is its value: it only tells the type checker.
            return self.expression(call.args[1].value, context, depth + 1)
        divides = name in {"div", "div_", "true_divide", "divide"}
        if isinstance(func, cst.Attribute) and divides and call.args:
            base = self.expression(func.value, context, depth + 1)
            return self._divided(base, call.args[0].value, call, context, depth)
        if isinstance(func, cst.Attribute) and name in {"mul", "mul_", "multiply"} and call.args:
            base = self.expression(func.value, context, depth + 1)
            factor = self.factor(call.args[0].value, context, depth)
            return self._scaled(base, "other" if factor in {"weight", "constant"} else factor, call)
        module_function = (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value in self._module_aliases(context)
        )
        if module_function and name in TENSOR_METHODS | {"div", "true_divide", "mul"}:
            # torch.sum(x), torch.mean(x): the tensor is the first argument.
            if not call.args:
                return Scaling("unknown", reason=f"`{_short(call)}` is not followed")
            if name in {"div", "true_divide"} and len(call.args) > 1:
                base = self.expression(call.args[0].value, context, depth + 1)
                return self._divided(base, call.args[1].value, call, context, depth)
            if name == "mul" and len(call.args) > 1:
                return Scaling("unknown", reason=f"`{_short(call)}` is not followed")
            return self.expression(call.args[0].value, context, depth + 1)
        if isinstance(func, cst.Attribute) and name in TENSOR_METHODS and not module_function:
            return self.expression(func.value, context, depth + 1)
        if isinstance(func, cst.Name) and func.value in {"sum", "float", "abs"} and call.args:
            return _combine_terms([self.expression(call.args[0].value, context, depth + 1)])
        target = (context.func.model or self.model).function_for_call(call, context.func)
        keywords = {a.keyword.value for a in call.args if a.keyword is not None}
        if keywords & {"num_items_in_batch"}:
            # Hugging Face losses divide by the token count of the whole accumulation window.
            return Scaling("accumulation", call, "num_items_in_batch")
        if target is None:
            target = self._forward_of(call, context)
        reduction = next(
            (
                a.value
                for a in call.args
                if a.keyword is not None and a.keyword.value == "reduction"
            ),
            None,
        )
        if isinstance(reduction, cst.SimpleString) and "sum" in reduction.value:
            return Scaling(
                "unknown",
                reason="a summed loss (reduction='sum') is normalised elsewhere, if at all",
                summed=True,
            )
        if target is not None and isinstance(target.node, cst.FunctionDef):
            if not target.returns:
                return Scaling("unknown", reason=f"`{_short(call.func)}` returns nothing visible")
            inner = _Context(
                target,
                {
                    p: (v, context)
                    for p, v in bind_arguments(
                        call,
                        target.node,
                        (context.func.model or self.model).partial_of(call, context.func),
                    )
                },
            )
            parts = [self._returned(value, inner, depth + 1, element) for value in target.returns]
            result = _either(parts)
            if result.verdict == "none" and any(
                ACCUMULATION_WORDS.search(code_of(a.value)) for a in call.args
            ):
                # A helper handed the window itself (`get_loss(..., accum_features, j)`: the
                # contrastive loss of the whole cached window, one chunk with gradients) may
                # weigh each micro-step as it should, however deep it is followed (learned
                # from static7 Chinese-CLIP).
                return Scaling("unknown", reason=f"`{_short(call)}` is given the accumulation")
            if (
                result.verdict == "unknown"
                and not result.summed
                and result.token_mean is None
                and not self._call_knows_accumulation(call, keywords)
                and not self._reaches_accumulation(target)
            ):
                # A project helper too deep or too unusual to follow to the end (box IoU
                # geometry, `** 2`, tuple unpacking) that is not handed the accumulation count
                # and whose code, with the helpers it calls, never names it: like a call the
                # analyser does not see into, it computes a fresh loss (learned from leads7
                # PyTorch-YOLOv3, whose `compute_loss` hid the undivided loss).
                return Scaling("none")
            return result
        # A call the analyser does not see into (a model, a criterion, F.cross_entropy): it
        # computes a fresh loss and knows nothing of the accumulation count.
        if any(ACCUMULATION_WORDS.search(code_of(a.value)) for a in call.args):
            return Scaling("unknown", reason=f"`{_short(call)}` is given the accumulation count")
        if self._call_knows_accumulation(call, keywords):
            # `loss_fn(..., num_global_valid_tokens=n)`: it may divide by the window's tokens.
            return Scaling("unknown", reason=f"`{_short(call)}` is given the window's token count")
        return Scaling("none")

    @staticmethod
    def _call_knows_accumulation(call: cst.Call, keywords: set[str]) -> bool:
        """``call`` is handed the accumulation count or the window's token count."""
        texts = [code_of(a.value) for a in call.args]
        return any(
            ACCUMULATION_WORDS.search(t) or WINDOW_TOKEN_WORDS.search(t) for t in texts
        ) or any(WINDOW_TOKEN_WORDS.search(k) for k in keywords)

    def _reaches_accumulation(self, target: FuncInfo) -> bool:
        """``target``, or a project function it calls (a few levels down), names the
        accumulation count: an accumulation word, a window token count, or the last name of
        the loop's divisor (``subdivisions`` of ``cfg['subdivisions']``)."""
        tail = None
        if self.divisor_text is not None:
            words = re.findall(r"[A-Za-z_]\w*", self.divisor_text)
            tail = words[-1] if words else None
        divisor = re.compile(rf"\b{re.escape(tail)}\b") if tail and len(tail) > 1 else None
        seen: set[int] = set()
        todo = [(target, 0)]
        while todo:
            func, level = todo.pop()
            if id(func.node) in seen:
                continue
            seen.add(id(func.node))
            text = code_of(func.node)
            if ACCUMULATION_WORDS.search(text) or WINDOW_TOKEN_WORDS.search(text):
                return True
            if divisor is not None and divisor.search(text):
                return True
            if level >= 3:
                continue
            owner = func.model or self.model
            for node in walk(func.node):
                if isinstance(node, cst.Call):
                    inner = owner.function_for_call(node, func)
                    if inner is not None:
                        todo.append((inner, level + 1))
        return False

    def _returned(
        self, value: cst.BaseExpression, context: _Context, depth: int, element: int | None
    ) -> Scaling:
        """A helper's return value, or its ``element``-th item (``return loss, stats``)."""
        if element is not None:
            if isinstance(value, cst.Tuple) and element < len(value.elements):
                return self.expression(value.elements[element].value, context, depth)
            if isinstance(value, cst.Call):
                return self._call(value, context, depth, element)
        return self.expression(value, context, depth)

    def origin(self, expr: cst.BaseExpression, context: _Context, depth: int) -> cst.CSTNode | None:
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.BinaryOperation):
            return self.origin(expr.left, context, depth + 1)
        if isinstance(expr, cst.Attribute | cst.Subscript):
            return self.origin(expr.value, context, depth + 1)
        if isinstance(expr, cst.Call):
            func = expr.func
            name = method_name(expr)
            if isinstance(func, cst.Attribute) and name in TENSOR_METHODS | {"div", "mul", "scale"}:
                return self.origin(func.value, context, depth + 1)
            return expr
        if not isinstance(expr, cst.Name):
            return None
        sites = self._sites(context.func, expr.value, expr)
        if sites is None:
            bound = context.bindings.get(expr.value)
            if bound is None:
                return None
            value, outer = bound
            return self.origin(value, outer or context, depth + 1)
        site = sites[0]
        if isinstance(site, cst.AugAssign):
            return self.origin(expr, context, depth + 1) if len(sites) > 1 else None
        if isinstance(site, cst.Assign):
            assigned = _assigned_value(site, expr.value)
            if assigned is None:
                return None
            found = self.origin(assigned, context, depth + 1)
            return site if found is assigned else found
        return None

    def _module_aliases(self, context: _Context) -> set[str]:
        model = context.func.model or self.model
        return {local for local, full in model.aliases.items() if "." not in local}

    def _forward_of(self, call: cst.Call, context: _Context) -> FuncInfo | None:
        """``forward`` of the local class an object was built from: ``model(x)`` with
        ``model = GPT(...).cuda()`` (through ``torch.compile``, ``DDP(...)``, ``.to()``)."""
        model = context.func.model or self.model
        class_name = instance_class(model, context.func, call.func)
        if class_name is None:
            return None
        return model.method_of(class_name, "forward")

    def _name(self, name: str, node: cst.CSTNode, context: _Context, depth: int) -> Scaling:
        if depth > MAX_DEPTH:
            return Scaling("unknown", reason="the loss goes through too many steps to follow")
        func = context.func
        sites = self._sites(func, name, node)
        if sites is None:
            bound = context.bindings.get(name)
            if bound is not None:
                value, outer = bound
                return self.expression(value, outer or context, depth + 1)
            if name in func.params:
                return Scaling("unknown", reason=f"`{name}` is a parameter")
            module = func.model.module_info if func.model is not None else None
            if module is not None and module is not func and module.assigns.get(name):
                return _either(
                    [
                        self.expression(v, _Context(module, {}), depth + 1)
                        for v in module.assigns[name]
                    ]
                )
            loop = _enclosing_loop_binding(func, name, node)
            if loop is not None:
                return self._iterated(loop.iter, context, depth + 1)
            return Scaling("unknown", reason=f"`{name}` is not assigned in the function")
        parts = [self._site(site, name, context, depth) for site in sites]
        if (
            sites
            and self._conditional(func, sites[-1], node)
            and self._has_entry_value(name, context)
            and not self._both_branches(func, sites, node)
        ):
            # Every assignment before the use is conditional: the value it had on entry (a
            # parameter, or what the caller passed) may reach the use as well.
            parts.append(self._entry_value(name, context, depth))
        return _either(parts)

    def _iterated(self, iterable: cst.BaseExpression, context: _Context, depth: int) -> Scaling:
        """The scaling of an item of ``iterable`` (a ``for`` loop's variable): what a data
        loader yields is fresh data, never divided by the accumulation count (learned from
        leads1 wheatley: PPO minibatches unpacked in the loop header); ``zip`` / ``enumerate``
        / ``tqdm`` wrappers yield items of their arguments."""
        if depth > MAX_DEPTH:
            return Scaling("unknown", reason="the loss goes through too many steps to follow")
        if isinstance(iterable, cst.Call):
            wrapper = method_name(iterable)
            if wrapper in ITERATION_WRAPPERS and iterable.args:
                return _either(
                    [
                        self._iterated(a.value, context, depth + 1)
                        for a in iterable.args
                        if a.keyword is None
                    ]
                    or [Scaling("none")]
                )
            return self.expression(iterable, context, depth + 1)
        if isinstance(iterable, cst.Name | cst.Attribute):
            text = code_of(iterable)
            kind = (context.func.model or self.model).kind_of(text)
            if DATA_WORDS.search(text) or kind is not None:
                return Scaling("none")
        return Scaling("unknown", reason=f"items of `{_short(iterable)}` are not followed")

    def _has_entry_value(self, name: str, context: _Context) -> bool:
        """``name`` can have a value before the function assigns it: a parameter, a value the
        caller passed, or a module global. Otherwise a path that skips every assignment
        raises at the use instead of reaching it (learned from leads1 wheatley: a value loss
        assigned in every branch of nested if/elif chains)."""
        func = context.func
        if name in context.bindings or name in func.params:
            return True
        module = func.model.module_info if func.model is not None else None
        return module is not None and module is not func and bool(module.assigns.get(name))

    def _entry_value(self, name: str, context: _Context, depth: int) -> Scaling:
        bound = context.bindings.get(name)
        if bound is not None:
            value, outer = bound
            return self.expression(value, outer or context, depth + 1)
        return Scaling("unknown", reason=f"`{name}` is assigned on some paths only")

    def _sites(self, func: FuncInfo, name: str, use: cst.CSTNode) -> list[cst.CSTNode] | None:
        """The assignments of ``name`` whose value can reach ``use`` (the last one before it in
        the function, plus earlier ones when the last is conditional), or None when ``name``
        is never assigned in ``func``."""
        sites = func.assign_sites.get(name)
        if not sites:
            return None
        order = self._order(func)
        use_index = order.get(id(use))
        if use_index is None:
            use_index = _first_order(order, use)
        model = func.model
        around = {id(a) for a in model.ancestors(use)} if model is not None else set()
        # `loss = loss / N` reads the previous value: an assignment never reaches its own value.
        before = [s for s in sites if order.get(id(s), -1) < use_index and id(s) not in around]
        if not before:
            if name in func.params:
                return None  # the parameter's value, re-bound only later
            # Assigned only after the use (a loop carrying it to the next iteration): all
            # but the use itself (`d["loss"] /= N` reads the value before it).
            before = [s for s in sites if id(s) not in around and s is not use]
        chosen: list[cst.CSTNode] = []
        for site in reversed(before):
            chosen.append(site)
            if not self._conditional(func, site, use):
                break
        return chosen

    def _site(self, site: cst.CSTNode, name: str, context: _Context, depth: int) -> Scaling:
        if isinstance(site, cst.AugAssign):
            previous = self._name(name, site, context, depth + 1)
            if isinstance(site.operator, cst.DivideAssign):
                return self._scaled(previous, self.divisor(site.value, context, depth), site)
            if isinstance(site.operator, cst.MultiplyAssign):
                factor = self.factor(site.value, context, depth)
                kind = "accumulation" if factor == "accumulation" else factor
                return self._scaled(
                    previous, "other" if kind in {"weight", "constant"} else kind, site
                )
            if isinstance(site.operator, cst.AddAssign | cst.SubtractAssign):
                return _combine_terms([previous, self.expression(site.value, context, depth + 1)])
            return Scaling("unknown", reason=f"`{_short(site)}` is not followed")
        if isinstance(site, cst.Assign):
            value = _assigned_value(site, name)
            if value is None:
                return Scaling("unknown", reason=f"`{name}` is unpacked from a tuple")
            element = _unpacked_index(site, name)
            if element is not None and isinstance(value, cst.Call):
                # `loss, stats = compute_loss(...)`: the first item of what it returns.
                return self._call(value, context, depth + 1, element)
            return self.expression(value, context, depth + 1)
        if isinstance(site, cst.AnnAssign) and site.value is not None:
            return self.expression(site.value, context, depth + 1)
        return Scaling("unknown", reason=f"`{name}` is bound in a way not followed")

    def _order(self, func: FuncInfo) -> dict[int, int]:
        cache: dict[int, dict[int, int]] = self.__dict__.setdefault("_orders", {})
        found = cache.get(id(func))
        if found is None:
            found = {id(node): index for index, node in enumerate(walk(func.node))}
            cache[id(func)] = found
        return found

    def _both_branches(self, func: FuncInfo, sites: list[cst.CSTNode], use: cst.CSTNode) -> bool:
        """Some ``if``/``else`` (not itself conditional for ``use``) assigns the name in both
        branches: one of the sites always runs."""
        model = func.model
        if model is None:
            return False
        use_chain = {id(n) for n in model.ancestors(use)}
        seen: dict[int, set[int]] = {}
        ifs: list[cst.If] = []
        for site in sites:
            chain = [site, *model.ancestors(site)]
            for child, parent in itertools.pairwise(chain):
                if id(parent) in use_chain:
                    break
                if isinstance(parent, cst.If) and child is not parent.test:
                    seen.setdefault(id(parent), set()).add(0 if child is parent.body else 1)
                    ifs.append(parent)
                    if seen[id(parent)] == {0, 1} and not self._conditional(func, parent, use):
                        return True
                    break

        def covered(node: cst.If) -> bool:
            # `if a: x = ... elif b: x = ... else: x = ...`: every branch of the chain assigns
            # (learned from leads1 wheatley, a value loss picked by an if/elif/else chain).
            branches = seen.get(id(node), set())
            if 0 not in branches:
                return False
            return 1 in branches or (isinstance(node.orelse, cst.If) and covered(node.orelse))

        for node in ifs:
            head = node
            parents = model.ancestors(node)
            for parent in parents:
                if isinstance(parent, cst.If) and parent.orelse is head:
                    head = parent  # climb from an `elif` to the `if` that starts the chain
                else:
                    break
            if covered(head) and not self._conditional(func, head, use):
                return True
        return False

    def _conditional(self, func: FuncInfo, site: cst.CSTNode, use: cst.CSTNode) -> bool:
        """True when ``site`` sits under an ``if`` (or loop) that ``use`` is not under."""
        model = func.model
        if model is None:
            return True
        use_chain = {id(n) for n in model.ancestors(use)}
        for parent in model.ancestors(site):
            if id(parent) in use_chain:
                return False
            if isinstance(parent, cst.If | cst.For | cst.While | cst.Try | cst.ExceptHandler):
                return True
        return False

    # -- divisors and factors ------------------------------------------------------------------
    def divisor(self, node: cst.BaseExpression, context: _Context, depth: int) -> str:
        """``accumulation`` / ``other`` / ``unknown`` (or ``counter``) for what a loss is
        divided by. When the accumulation count is not written anywhere (a micro-step loop over
        a list), nothing is ``other``: the analyser cannot tell what N is."""
        verdict = self._divisor(node, context, depth)
        if verdict == "other" and self.divisor_text is None:
            return "unknown"
        return verdict

    def _divisor(self, node: cst.BaseExpression, context: _Context, depth: int) -> str:
        inner = _number_cast(node)
        if inner is not None:
            # `loss / float(self.accum_steps)` divides by the count itself.
            return self._divisor(inner, context, depth + 1)
        text = code_of(node)
        if self._length_of_window(node):
            return "accumulation"
        if self.counter is not None and text == self.counter:
            return "counter"  # the running micro-step counter (1, 2, 3...), not N
        if self._is_accumulation_count(node, text):
            return "accumulation"
        value = number_value(node)
        if value is not None:
            return "other"
        if WINDOW_TOKEN_WORDS.search(text):
            return "accumulation"
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            # `loss / (batch_size * accum_steps)`: the window's sample count includes N.
            sides = [self.divisor(side, context, depth + 1) for side in (node.left, node.right)]
            if "accumulation" in sides:
                return "accumulation"
            if "unknown" in sides:
                return "unknown"
        if isinstance(node, cst.Name) and self._splits_into_accumulation(node.value, context):
            return "accumulation"
        if isinstance(node, cst.Name) and depth < MAX_DEPTH:
            verdict = self._named_divisor(node.value, node, context, depth)
            if verdict is not None:
                return verdict
        if BATCH_STATISTIC.search(text):
            return "other"
        if isinstance(node, cst.Call | cst.BinaryOperation | cst.Subscript):
            return "other" if not _names_accumulation(node) else "unknown"
        return "unknown"

    def _named_divisor(
        self, name: str, node: cst.CSTNode, context: _Context, depth: int
    ) -> str | None:
        func = context.func
        sites = self._sites(func, name, node)
        if sites is None:
            bound = context.bindings.get(name)
            if bound is not None:
                value, outer = bound
                return self.divisor(value, outer or context, depth + 1)
            return None
        verdicts: set[str] = set()
        for site in sites:
            assigned = site.value if isinstance(site, cst.Assign) else None
            if assigned is None:
                return "unknown"
            # Inside the micro-step loop, or in a helper it calls (a loss function that counts
            # the real tokens of its own batch): either way a count per micro-batch.
            inside = self.micro is not None and (
                any(p is self.micro for p in (func.model.ancestors(site) if func.model else []))
                or self._per_micro_batch(site, context)
            )
            verdict = self.divisor(assigned, context, depth + 1)
            # A token count made before the micro-batches run: the window's token count.
            before_window = verdict == "other" and self.micro is not None and not inside
            if before_window and TOKEN_WORDS.search(name + code_of(assigned)):
                verdict = "accumulation"
            verdicts.add(verdict)
        if len(verdicts) == 1:
            return verdicts.pop()
        return "unknown"

    def factor(self, node: cst.BaseExpression, context: _Context, depth: int) -> str:
        """``accumulation`` (``1 / N``), ``constant`` (a literal), ``weight`` (a loss weight),
        ``unknown``, or ``tensor`` (another loss term) for one side of a product."""
        if number_value(node) is not None:
            return "constant"
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            # `loss.mul(scale / N)` is `loss * scale / N`: the product is divided by N
            # whatever `scale` is.
            verdict = self.divisor(node.right, context, depth + 1)
            if verdict == "accumulation":
                return "accumulation"
            if number_value(node.left) is not None:
                return "constant"
        text = code_of(node)
        if isinstance(node, cst.Name):
            sites = self._sites(context.func, node.value, node)
            if sites:
                values = [s.value for s in sites if isinstance(s, cst.Assign)]
                if values and all(
                    self.factor(v, context, depth + 1) == "accumulation" for v in values
                ):
                    return "accumulation"
                if values and all(number_value(v) is not None for v in values):
                    return "constant"
                if values and all(_is_tensor_term(v) for v in values):
                    return "tensor"
            bound = context.bindings.get(node.value)
            if bound is not None and depth < MAX_DEPTH:
                value, outer = bound
                return self.factor(value, outer or context, depth + 1)
        if ACCUMULATION_WORDS.search(text) and "scale" in text.lower():
            return "accumulation"
        if WEIGHT_WORDS.search(text):
            return "weight"
        if isinstance(node, cst.Name | cst.Attribute):
            if "scale" in text.lower() or "factor" in text.lower():
                return "unknown"
            return "tensor"
        return "tensor"

    def _micro_batch_tokens(
        self, node: cst.BaseExpression, context: _Context, depth: int, *, named: bool
    ) -> bool:
        """True when ``node`` counts the real tokens of one micro-batch: something named as a
        token count (``max_tokens``, ``mask.sum()``, ``(labels != pad).sum()``; ``named`` says
        a name on the way here already did) whose value is read off the data (a sum, an item
        of the batch) inside the micro-step loop or in a helper it calls. A count made before
        the micro-batches run, a setting, or a name the analyser cannot follow is not; nor is
        the number of padded positions (``rows * width``, ``ids.numel()``): dividing every
        micro-batch's token sum by that keeps each token's weight equal."""
        return self._token_count(node, context, depth, named=named) == "real"

    def _token_count(
        self, node: cst.BaseExpression, context: _Context, depth: int, *, named: bool
    ) -> TokenCount | None:
        """What ``node`` counts per micro-batch: its ``real`` tokens, its padded
        ``positions``, or None (not a per-micro-batch token count the analyser can see)."""
        if depth > MAX_DEPTH:
            return None
        text = code_of(node)
        if WINDOW_TOKEN_WORDS.search(text) or ACCUMULATION_WORDS.search(text):
            return None
        named = named or bool(TOKEN_WORDS.search(text))
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value in {"int", "float"}
            and len(node.args) == 1
        ):
            # `int(total_tokens)`: the same count.
            return self._token_count(node.args[0].value, context, depth + 1, named=named)
        if isinstance(node, cst.Name):
            sites = self._sites(context.func, node.value, node)
            if sites is None:
                bound = context.bindings.get(node.value)
                if bound is None:
                    return None  # a parameter nobody visible passes: cannot tell
                value, outer = bound
                return self._token_count(value, outer or context, depth + 1, named=named)
            if not sites or not all(isinstance(site, cst.Assign) for site in sites):
                return None
            kinds = [self._site_count(site, node.value, context, depth, named) for site in sites]
            if None in kinds:
                return None
            # `max_tokens = rows * width` or, under a flag, `int(total_tokens)`: the real count
            # on some configurations is enough.
            return "real" if "real" in kinds else "positions"
        if not named or not DATA_STATISTIC.search(text) or not self._per_micro_batch(node, context):
            return None
        if per_row_count(node):
            # `mask.sum(-1)`: one count per sequence, so the division makes a per-sequence
            # mean; the micro-batch's mean over sequences divides by N exactly (learned from
            # static6 direct-preference-optimization).
            return None
        return "real" if REAL_COUNT.search(POSITION_READS.sub("", text)) else "positions"

    def _site_count(
        self, site: cst.CSTNode, name: str, context: _Context, depth: int, named: bool
    ) -> TokenCount | None:
        assert isinstance(site, cst.Assign)
        value = _assigned_value(site, name)
        if value is None:
            # `micro_batch_size, seq_len = input_ids.shape`: one dimension of the data.
            value = site.value
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
            # `batch_size * seq_len`: the token positions of this micro-batch.
            named = named or bool(TOKEN_WORDS.search(name))
            if not named or not self._per_micro_batch(site, context):
                return None
            if all(
                self._data_count(side, context, depth + 1) for side in (value.left, value.right)
            ):
                return "positions"
            return None
        kind = self._token_count(
            value, context, depth + 1, named=named or bool(TOKEN_WORDS.search(name))
        )
        return kind if kind is not None and self._per_micro_batch(site, context) else None

    def _data_count(self, node: cst.BaseExpression, context: _Context, depth: int) -> bool:
        """A factor of a token count read off the data (``input_ids.shape``, ``x.size(1)``)."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, cst.Name):
            sites = self._sites(context.func, node.value, node)
            if not sites or not all(isinstance(s, cst.Assign) for s in sites):
                return False
            return all(
                self._data_count(s.value, context, depth + 1)  # type: ignore[attr-defined]
                for s in sites
            )
        return bool(DATA_STATISTIC.search(code_of(node)))

    def _per_micro_batch(self, node: cst.CSTNode, context: _Context) -> bool:
        """``node`` runs once per micro-batch: inside the micro-step loop, or in a helper (a
        function without that loop, called from inside it)."""
        loop = self.micro
        if loop is None:
            return False
        func = context.func
        model = func.model
        if model is None or not model.owns(node):
            return False
        if any(parent is loop for parent in model.ancestors(node)):
            return True
        return id(loop) not in func.loop_ids and id(func.node) not in {
            id(p) for p in self.model.ancestors(loop)
        }

    def _length_of_window(self, node: cst.BaseExpression) -> bool:
        """``len(chunks)`` for a micro-step loop ``for chunk in chunks:``: N itself."""
        loop = self.micro
        return (
            isinstance(loop, cst.For)
            and isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "len"
            and len(node.args) == 1
            and code_of(node.args[0].value) == code_of(loop.iter)
        )

    def _splits_into_accumulation(self, name: str, context: _Context) -> bool:
        """``name`` is what the accumulation count is made from: every assignment of the count
        in this function is ``N = name // per_micro_batch`` (``rounds = samples // chunk``), so
        ``name`` is N micro-batches' worth and dividing by it divides by N."""
        count = self.divisor_text
        if count is None or not count.isidentifier():
            return False
        sites = context.func.assign_sites.get(count)
        if not sites:
            return False
        for site in sites:
            value = _assigned_value(site, count) if isinstance(site, cst.Assign) else None
            if not (
                isinstance(value, cst.BinaryOperation)
                and isinstance(value.operator, cst.FloorDivide | cst.Divide)
                and code_of(value.left) == name
            ):
                return False
        return True

    def _multiplied_by_count(self, numerator: cst.BaseExpression) -> bool:
        """Whether ``numerator`` is a product with the accumulation count itself (not ``1 / N``)
        as one of its factors."""
        factors: list[cst.BaseExpression] = []
        pending = [numerator]
        while pending:
            current = pending.pop()
            if isinstance(current, cst.BinaryOperation) and isinstance(
                current.operator, cst.Multiply
            ):
                pending += [current.left, current.right]
            else:
                factors.append(current)
        return len(factors) > 1 and any(
            isinstance(f, cst.Name | cst.Attribute | cst.Call)
            and self._is_accumulation_count(f, code_of(f))
            for f in factors
        )

    def _is_accumulation_count(self, node: cst.BaseExpression, text: str) -> bool:
        if self.divisor_text is not None and _same_name(text, self.divisor_text):
            return True
        return bool(ACCUMULATION_WORDS.search(text)) and not BATCH_STATISTIC.search(
            re.sub(ACCUMULATION_WORDS, "", text)
        )


_COUNT_WRAPPERS = frozenset({"clamp", "clamp_min", "clip", "float", "to", "type_as", "detach"})
_REDUCTIONS = frozenset({"sum", "count_nonzero", "nansum"})
_DIM_WORDS = frozenset({"dim", "axis"})


def per_row_count(node: cst.BaseExpression) -> bool:
    """``mask.sum(-1)``, ``mask.sum(dim=1, keepdim=True).clamp(min=1)``: a reduction over one
    dimension that leaves one count per row (per sequence), not one per micro-batch."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in _COUNT_WRAPPERS
    ):
        node = node.func.value
    if not (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in _REDUCTIONS
    ):
        return False
    dim = next(
        (a.value for a in node.args if a.keyword is not None and a.keyword.value in _DIM_WORDS),
        None,
    )
    if dim is None:
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        dim = positional[0] if positional else None
    if isinstance(dim, cst.UnaryOperation) and isinstance(dim.operator, cst.Minus):
        dim = dim.expression
    return isinstance(dim, cst.Integer)


def _numerator(division: cst.CSTNode) -> cst.BaseExpression | None:
    """What ``a / b`` or ``a.div(b)`` divides."""
    if isinstance(division, cst.BinaryOperation):
        return division.left
    if isinstance(division, cst.Call) and isinstance(division.func, cst.Attribute):
        return division.func.value
    return None


def _assigned_value(site: cst.Assign, name: str) -> cst.BaseExpression | None:
    """What ``site`` binds to ``name``: the value, or its element for ``a, b = x, y``; for
    ``logits, loss = model(x)`` the call itself (the loss is one of its results)."""
    value = site.value
    for target in site.targets:
        bound = target.target
        if isinstance(bound, cst.Name) and bound.value == name:
            return value
        if keyed_place(bound) == name:
            return value
        if isinstance(bound, cst.Tuple | cst.List):
            names = [e.value for e in bound.elements]
            if isinstance(value, cst.Tuple | cst.List):
                if len(value.elements) != len(names):
                    return None
                for element, item in zip(names, value.elements, strict=True):
                    if isinstance(element, cst.Name) and element.value == name:
                        return item.value
                return None
            if any(isinstance(e, cst.Name) and e.value == name for e in names):
                return value
    return None


def _unpacked_index(site: cst.Assign, name: str) -> int | None:
    """The position of ``name`` in a tuple target unpacking a call (``loss, aux = f(x)``)."""
    if len(site.targets) != 1 or isinstance(site.value, cst.Tuple | cst.List):
        return None
    bound = site.targets[0].target
    if not isinstance(bound, cst.Tuple | cst.List):
        return None
    if any(isinstance(e, cst.StarredElement) for e in bound.elements):
        return None
    for index, element in enumerate(bound.elements):
        if isinstance(element.value, cst.Name) and element.value.value == name:
            return index
    return None


WRAPPERS = frozenset(
    {
        "compile",
        "DistributedDataParallel",
        "DDP",
        "FSDP",
        "FullyShardedDataParallel",
        "DataParallel",
    }
)


def instance_class(
    model: FileModel, func: FuncInfo, expr: cst.BaseExpression, depth: int = 0
) -> str | None:
    """The local class whose instance ``expr`` names, when its construction is visible."""
    if depth > 6:
        return None
    if isinstance(expr, cst.Call):
        callee = expr.func
        if isinstance(callee, cst.Name) and callee.value in model.class_nodes:
            return callee.value
        last = (dotted_name(callee) or "").rsplit(".", 1)[-1]
        if last in WRAPPERS and expr.args:
            return instance_class(model, func, expr.args[0].value, depth + 1)
        if isinstance(callee, cst.Attribute) and callee.attr.value in {
            "to",
            "cuda",
            "half",
            "float",
        }:
            return instance_class(model, func, callee.value, depth + 1)
        return None
    text = dotted_name(expr) if isinstance(expr, cst.Name | cst.Attribute) else None
    if text is None:
        return None
    values: list[cst.BaseExpression] = []
    if isinstance(expr, cst.Name):
        values = func.assigns.get(text, []) or model.module_info.assigns.get(text, [])
    else:
        values = model.attribute_assigns.get(attribute_key(text, func.class_name), [])
    for value in values:
        found = instance_class(model, func, value, depth + 1)
        if found is not None:
            return found
    return None


def _same_name(a: str, b: str) -> bool:
    """``args.accum_steps`` and ``self.accum_steps`` name the same setting."""
    if a == b:
        return True
    tail_a = a.rsplit(".", 1)[-1]
    tail_b = b.rsplit(".", 1)[-1]
    return tail_a == tail_b and tail_a.isidentifier() and len(tail_a) > 1


ITERATION_WRAPPERS = frozenset({"zip", "enumerate", "tqdm", "iter", "sorted", "reversed"})
DATA_WORDS = re.compile(r"(?i)(loader|dataset|data\b|batches|minibatch|rollout|buffer|storage)")


def _enclosing_loop_binding(func: FuncInfo, name: str, use: cst.CSTNode) -> cst.For | None:
    """The ``for`` loop around ``use`` whose header binds ``name``."""
    model = func.model
    if model is None:
        return None
    for node in model.ancestors(use):
        if isinstance(node, cst.For) and name in _target_names(node.target):
            return node
        if node is func.node:
            break
    return None


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple | cst.List):
        return {n for e in target.elements for n in _target_names(e.value)}
    return set()


def _number_cast(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """``x`` of ``float(x)`` / ``int(x)`` (a cast of a count keeps its meaning), and of
    ``max(1, x)`` / ``max(x, 1)`` (a floor that only guards against zero)."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
        return None
    if any(arg.keyword or arg.star for arg in node.args):
        return None
    if node.func.value in {"float", "int"} and len(node.args) == 1:
        return node.args[0].value
    if node.func.value == "max" and len(node.args) == 2:
        values = [arg.value for arg in node.args]
        floors = [v for v in values if number_value(v) is not None]
        if len(floors) == 1:
            return next(v for v in values if number_value(v) is None)
    return None


def _names_accumulation(node: cst.CSTNode) -> bool:
    return bool(ACCUMULATION_WORDS.search(code_of(node)))


def _is_tensor_term(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call)


def _first_order(order: dict[int, int], node: cst.CSTNode) -> int:
    for inner in walk(node):
        if id(inner) in order:
            return order[id(inner)]
    return 0


def _short(node: cst.CSTNode) -> str:
    text = " ".join(code_of(node).split())
    return text if len(text) <= 50 else text[:47] + "..."


def divided_names(nodes: Iterable[cst.CSTNode]) -> set[str]:
    """Every dotted name that appears in ``nodes`` (for messages)."""
    out: set[str] = set()
    for node in nodes:
        for inner in walk(node):
            if isinstance(inner, cst.Name | cst.Attribute):
                text = dotted_name(inner)
                if text:
                    out.add(text)
    return out
