"""Whether a value in a loss can reach 0: its provenance decides.

``log``, ``sqrt`` (or a power below 1) and a division are hazards only when their input can
be exactly 0 (or negative). Whether it can is read from how the value is built:

* strictly positive by construction: ``exp(...)``, ``softplus(...)``, a clamp with a positive
  minimum, a non-negative value plus a positive constant or an epsilon, a product, quotient or
  power of positive values, a reduction (or a norm) of positive values, and any of these
  reached through local names, casts, reshapes, indexing, or what a project function, method
  or module's ``forward`` returns (``mag = stft(x)`` with ``stft`` returning a clamped
  magnitude; ``recon, mean, std = self.vae(x)`` with ``std = torch.exp(log_std)`` in
  ``VAE.forward``);
* a parameter whose every caller in the file passes a positive value (a loss module's
  ``forward(x_mag, y_mag)`` called only with clamped magnitudes), or that no caller of the file
  passes and whose default is a positive number; a hyper-parameter: an attribute set only
  from a positive number or from a constructor parameter with a positive default
  (``self.scale = scale`` with ``__init__(self, scale=3)``);
* a registered buffer (``self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))``):
  its registered value decides, and it never carries a gradient; ``linspace`` of positive
  ends, a running product of values in (0, 1), ``math.pi``;
* a constant array of positive numbers (``np.array([1 / 2 ** i for i in range(n)])``,
  ``torch.tensor([0.5, 0.3])``) and its sum: writing one element later (``w[-1] = 0``) keeps
  the sum of the others;
* the squared norm of a gradient returned by ``torch.autograd.grad`` (the gradient penalty of
  WGAN-GP and its relatives): it is 0 only where the critic's gradient is exactly 0 at every
  input element, which does not happen in practice, and the canonical formulation takes its
  square root as written;
* everything else can reach 0 as far as the analyser can tell: sums of masks and indicators,
  counts of selected elements, unions and areas, probabilities from ``softmax``/``sigmoid``
  (which underflow to exactly 0 in float32), ``1 - p``.

Only reads the file's model; follows at most :data:`MAX_DEPTH` definitions.
"""

from __future__ import annotations

from typing import Literal

import libcst as cst

from gradient_doctor.probes.static.loss_scope import resolve_call
from gradient_doctor.probes.static.model import FileModel, FuncInfo, attribute_key, bind_arguments
from gradient_doctor.probes.static.names import code_of, dotted_name, method_name, number_value
from gradient_doctor.probes.static.traverse import walk

MAX_DEPTH = 6

POSITIVE_CALLS = frozenset({"exp", "exp_", "softplus"})
"""Functions whose value is strictly positive whatever their input."""
NON_NEGATIVE_CALLS = frozenset(
    {
        "abs",
        "square",
        "relu",
        "sigmoid",
        "softmax",
        "norm",
        "exp",
        "exp_",
        "softplus",
        "sqrt",
        # Distances between a prediction and a target (any reduction):
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
    }
)
"""Functions whose value is at least 0 (but can be exactly 0)."""
CLAMPS = frozenset({"clamp", "clip", "clamp_min", "clamp_"})
SAME_VALUE_METHODS = frozenset(
    {
        "float",
        "double",
        "half",
        "to",
        "type_as",
        "contiguous",
        "view",
        "reshape",
        "squeeze",
        "unsqueeze",
        "flatten",
        "detach",
        "clone",
        "expand",
        "expand_as",
        "view_as",
        "permute",
        "transpose",
        "repeat",
        "cuda",
        "cpu",
        "flip",
        "roll",
    }
)
"""Methods that keep every element's value (casts, reshapes, copies, device moves, and
reorderings: ``flip`` and ``roll`` move values without changing any)."""
REDUCTIONS_OF_ELEMENTS = frozenset({"sum", "mean", "prod", "amax", "amin", "max", "min"})
"""Reductions whose result is positive when every element is."""
SELECTIONS = frozenset(
    {
        "masked_select",
        "gather",
        "index_select",
        "take",
        "take_along_dim",
        "narrow",
        "select",
        "diagonal",
    }
)
"""Calls that keep a subset of the elements: positive when every element of the input is."""
JOINS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})
"""Calls that join a list of tensors: positive when every joined tensor is."""
NORMS = frozenset({"norm", "vector_norm"})
"""Norms: positive when every element of the input is (a magnitude clamped above 0)."""
ARRAY_BUILDERS = frozenset(
    {"array", "asarray", "tensor", "as_tensor", "Tensor", "FloatTensor", "DoubleTensor"}
)
"""Calls that make an array of the numbers they are given."""
REDUCTIONS_OF_SOME = frozenset({"sum", "mean", "amax", "max"})
"""Reductions that stay positive when one element is (every other being non-negative)."""
MASK_BUILDERS = frozenset({"zeros", "ones", "eye", "zeros_like", "ones_like"})
"""Calls that build an array of 0s and 1s (or cast a mask)."""
CONSTRUCTOR = "__init__"
FORWARD_METHODS = frozenset({"forward", "__call__"})
DETACHED_ATTRIBUTES = frozenset({"data", "shape", "dtype", "device", "ndim", "is_cuda"})
"""Attributes of a tensor that carry no gradient."""
TENSOR_PROPERTIES = frozenset({"T", "mT", "real", "imag", "values", "indices"})
"""Attributes of a tensor that keep its gradient (and its freedom from one); ``values`` and
``indices`` of a ``torch.min/max(..., dim)`` result."""
MATH_MODULES = frozenset({"math", "np", "numpy"})
LIBRARY_HEADS = frozenset({"torch", "th", "F", "np", "numpy", "math", "nn"})
DETACHING_CALLS = frozenset(
    {"detach", "detach_", "item", "tolist", "numpy", "len", "int", "float", "range", "size"}
)
"""Calls whose result carries no gradient (Python numbers, sizes, detached tensors)."""
SAMPLED_OR_CONSTANT = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "rand_like",
        "randn_like",
        "randint_like",
        "randperm",
        "arange",
        "linspace",
        "logspace",
        "zeros",
        "ones",
        "zeros_like",
        "ones_like",
        "empty",
        "empty_like",
        "full_like",
        "eye",
        "tensor",
        "as_tensor",
        "from_numpy",
    }
)
"""Tensors made by sampling or from constants: leaves without a gradient (``torch.tensor``
copies even a tensor that has one). ``requires_grad=True`` among the arguments says
otherwise."""
GRADIENT_READERS = frozenset({"grad"})
"""``torch.autograd.grad(..., create_graph=True)`` can carry a second-order gradient."""
OFFSET_WORDS = ("eps", "epsilon", "offset", "smooth", "tiny", "floor")


def offset_name(name: str) -> bool:
    """A name for a small positive constant added to keep a value off 0."""
    lowered = name.lower()
    return any(word in lowered for word in OFFSET_WORDS)


def called_name(call: cst.Call) -> str:
    """The last part of the called name: ``clamp`` for ``x.clamp(...)`` or ``torch.clamp(...)``."""
    return method_name(call) or (dotted_name(call.func) or "").rsplit(".", 1)[-1]


class Positivity:
    """Answers "is this value strictly positive by construction?" for one file."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._callers: dict[int, dict[int, list[tuple[cst.Call, FuncInfo]]]] = {}
        self._aliases: dict[int, frozenset[str]] = {}

    # -- the public questions -----------------------------------------------------------------
    def positive(self, node: cst.BaseExpression, func: FuncInfo) -> bool:
        """``node`` (read in ``func``) is strictly positive by how it is built."""
        return self._positive(node, func, 0, frozenset())

    def zero_filled(self, node: cst.BaseExpression) -> bool:
        """``node`` replaces exactly the zeros of a value by a positive epsilon:
        ``p + (p == 0) * eps`` (the mask cast by ``.float()`` or named on an earlier line),
        ``torch.where(p == 0, eps, p)`` or ``p.masked_fill(p == 0, eps)``. For a value that is
        never negative (a probability) this is a guard as good as a clamp (learned from a
        discrete SAC's ``log(probs + (probs == 0.0).float() * 1e-8)``); a mask of another
        value (``p == 1``) guards nothing."""
        node = _cast_free(node)
        if isinstance(node, cst.Name):
            value = reaching_value(self.model, node)
            return value is not None and self._zero_filled(value, 0)
        return self._zero_filled(node, 0)

    def _zero_filled(self, node: cst.BaseExpression, depth: int) -> bool:
        node = _cast_free(node)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            return self._zero_epsilon(node.right, node.left) or self._zero_epsilon(
                node.left, node.right
            )
        if not isinstance(node, cst.Call):
            return False
        name = called_name(node)
        positional = [a.value for a in node.args if a.keyword is None]
        if name == "where" and len(positional) == 3 and not isinstance(node.func, cst.Name):
            condition, chosen, other = positional
            return _epsilon(chosen) and self._zero_mask(condition, other)
        if name in {"masked_fill", "masked_fill_"}:
            if isinstance(node.func, cst.Attribute) and dotted_name(node.func.value) not in (
                LIBRARY_OWNERS
            ):
                subject: cst.BaseExpression = node.func.value
            elif len(positional) == 3:
                subject, *positional = positional
            else:
                return False
            return (
                len(positional) == 2
                and _epsilon(positional[1])
                and self._zero_mask(positional[0], subject)
            )
        return False

    def _zero_epsilon(self, node: cst.BaseExpression, base: cst.BaseExpression) -> bool:
        """``node`` is ``mask * eps`` (either order, through one name) where ``mask`` is
        ``base == 0``."""
        node = _cast_free(node)
        if isinstance(node, cst.Name):
            value = reaching_value(self.model, node)
            if value is None:
                return False
            node = _cast_free(value)
        if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply)):
            return False
        return (_epsilon(node.right) and self._zero_mask(node.left, base)) or (
            _epsilon(node.left) and self._zero_mask(node.right, base)
        )

    def _zero_mask(self, node: cst.BaseExpression, base: cst.BaseExpression) -> bool:
        """``node`` is ``base == 0`` (cast, parenthesised or named on an earlier line)."""
        node = _cast_free(node)
        if isinstance(node, cst.Name):
            value = reaching_value(self.model, node)
            if value is None:
                return False
            node = _cast_free(value)
        if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
            return False
        (target,) = node.comparisons
        if not isinstance(target.operator, cst.Equal):
            return False
        for side, other in ((node.left, target.comparator), (target.comparator, node.left)):
            zero = number_value(other, arithmetic=True)
            if zero == 0 and code_of(_cast_free(side)) == code_of(_cast_free(base)):
                return True
        return False

    def gradient_norm(self, node: cst.BaseExpression, func: FuncInfo) -> bool:
        """``sum(g ** 2)`` / ``(g ** 2).sum(dim)`` / ``g.pow(2).sum()`` of a gradient ``g``
        returned by ``torch.autograd.grad``: the squared norm of a gradient penalty."""
        node = self._same_value(node)
        if not isinstance(node, cst.Call) or called_name(node) not in {"sum", "mean"}:
            return False
        inner = _subject(node)
        if inner is None:
            return False
        squared = self._squared_base(inner)
        return squared is not None and self._autograd_gradient(squared, func, 0, frozenset())

    # -- positivity ---------------------------------------------------------------------------
    def _positive(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        if depth > MAX_DEPTH:
            return False
        node = self._same_value(node)
        value = number_value(node)
        if value is not None:
            return value > 0
        if isinstance(node, cst.Name | cst.Attribute) and offset_name(_last_part(node)):
            return True
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in {"pi", "e", "tau"}
            and dotted_name(node.value) in MATH_MODULES | {"torch"}
        ):
            return True  # `math.pi`, `np.e`
        if isinstance(node, cst.Name | cst.Attribute):
            reaching = reaching_value(func.model or self.model, node)
            if reaching is not None and self._positive(reaching, func, depth + 1, seen):
                return True
        if isinstance(node, cst.Name):
            return self._name_positive(node.value, func, depth, seen)
        if isinstance(node, cst.Attribute):
            return self._attribute_positive(node, func, depth, seen)
        if isinstance(node, cst.Subscript):
            # The tree bounds indexing (`b[t][:, None]`): only definitions and calls count.
            return self._positive(node.value, func, depth, seen)
        if isinstance(node, cst.BinaryOperation):
            return self._operation_positive(node, func, depth, seen)
        if isinstance(node, cst.Call):
            return self._call_positive(node, func, depth, seen)
        if isinstance(node, cst.List | cst.Tuple):
            # `[0.5, 0.25]`: every element a positive value.
            return bool(node.elements) and all(
                isinstance(element, cst.Element)
                and self._positive(element.value, func, depth + 1, seen)
                for element in node.elements
            )
        if isinstance(node, cst.ListComp | cst.GeneratorExp):
            # `[1 / 2 ** i for i in range(n)]`: the element's expression decides; a loop
            # variable over positive values (`[w / total for w in weights]`) is positive.
            inner_seen = seen
            clause: cst.CompFor | None = node.for_in
            while clause is not None:
                if isinstance(clause.target, cst.Name) and self._positive(
                    clause.iter, func, depth + 1, inner_seen
                ):
                    inner_seen = inner_seen | {clause.target.value}
                clause = clause.inner_for_in
            return self._positive(node.elt, func, depth + 1, inner_seen)
        return False

    def _operation_positive(
        self, node: cst.BinaryOperation, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        left, right = node.left, node.right
        if isinstance(node.operator, cst.Add):
            return (
                self._positive(left, func, depth + 1, seen)
                and self._non_negative(right, func, depth + 1, seen)
            ) or (
                self._positive(right, func, depth + 1, seen)
                and self._non_negative(left, func, depth + 1, seen)
            )
        if isinstance(node.operator, cst.Divide) and self._smoothed_ratio(left, right, func):
            return True
        if isinstance(node.operator, cst.Multiply | cst.Divide):
            return self._positive(left, func, depth + 1, seen) and self._positive(
                right, func, depth + 1, seen
            )
        if isinstance(node.operator, cst.Power):
            return self._positive(left, func, depth + 1, seen)
        if isinstance(node.operator, cst.Subtract):
            if number_value(right, arithmetic=True) == 1:
                # `exp(x) - 1` has the sign of `x`, like `expm1(x)`.
                exponent = _exponentiated(left)
                return exponent is not None and self._positive(exponent, func, depth + 1, seen)
            # `1.0 - p` with `p` kept strictly below 1 (`p = clamp(p, eps, 1 - eps)`).
            ceiling = number_value(left, arithmetic=True)
            return ceiling is not None and self.below(right, ceiling, func, depth + 1)
        return False

    def _smoothed_ratio(
        self, left: cst.BaseExpression, right: cst.BaseExpression, func: FuncInfo
    ) -> bool:
        """``(2 * inter + smooth) / (union + smooth)``: the same positive smoothing term added
        to the numerator and the denominator (Laplace smoothing of a Dice, IoU or Tversky
        ratio). It is there to keep the ratio off 0/0 and off 0 when a prediction and its
        target do not overlap; the overlap it is added to is a count or a sum of products
        of non-negative maps (learned from static9 Loss_ToolBox, whose ``-log(1 - dice)``
        takes the log of such a ratio)."""
        numerator = self._single_definition(left, func)
        denominator = self._single_definition(right, func)
        if not all(
            isinstance(side, cst.BinaryOperation) and isinstance(side.operator, cst.Add)
            for side in (numerator, denominator)
        ):
            return False
        assert isinstance(numerator, cst.BinaryOperation)
        assert isinstance(denominator, cst.BinaryOperation)
        offset = code_of(numerator.right)
        return (
            offset == code_of(denominator.right)
            and isinstance(numerator.right, cst.Name | cst.Attribute | cst.Integer | cst.Float)
            and self._positive(numerator.right, func, 0, frozenset())
        )

    def _single_definition(self, node: cst.BaseExpression, func: FuncInfo) -> cst.BaseExpression:
        """What a local name stands for when it is assigned once (else ``node`` itself)."""
        node = self._same_value(node)
        if isinstance(node, cst.Name):
            values = func.assigns.get(node.value, [])
            if len(values) == 1:
                return self._same_value(values[0])
        return node

    def _call_positive(
        self, call: cst.Call, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        name = called_name(call)
        if name in POSITIVE_CALLS:
            return True
        if name in CLAMPS:
            # `x.clamp(min=1e-6)`, `x.clamp(min=self.floor_value)` with a positive setting.
            bound = clamp_bound(call, "min")
            return _positive_bound(bound) or (
                bound is not None and self._positive(bound, func, depth + 1, seen)
            )
        if name in JOINS:
            # `torch.cat([pos, pos])`: positive when every joined tensor is.
            joined = call.args[0].value if call.args else None
            return (
                isinstance(joined, cst.List | cst.Tuple)
                and bool(joined.elements)
                and all(
                    self._positive(element.value, func, depth + 1, seen)
                    for element in joined.elements
                    if isinstance(element, cst.Element)
                )
                and all(isinstance(element, cst.Element) for element in joined.elements)
            )
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        operands = _added(call, positional, self._torch_aliases(func))
        if operands is not None:
            # `p.add(1e-5)`, `torch.add(p, eps)`: an epsilon added by a method, as by `+`.
            first, second = operands
            return (
                self._positive(first, func, depth + 1, seen)
                and self._non_negative(second, func, depth + 1, seen)
            ) or (
                self._positive(second, func, depth + 1, seen)
                and self._non_negative(first, func, depth + 1, seen)
            )
        if name in ARRAY_BUILDERS:
            given = call.args[0].value if call.args and call.args[0].keyword is None else None
            return given is not None and self._positive(given, func, depth + 1, seen)
        if name in {"ones", "ones_like"}:
            return True
        if name == "linspace":
            ends = positional[:2]
            return len(ends) == 2 and all(self._positive(e, func, depth + 1, seen) for e in ends)
        if name == "expm1":
            # `expm1(x)` has the sign of `x`: positive exactly where `x` is.
            subject = _subject(call, self._torch_aliases(func))
            return subject is not None and self._positive(subject, func, depth + 1, seen)
        if name in {"full", "full_like"} and len(positional) >= 2:
            return self._positive(positional[1], func, depth + 1, seen)
        if name in {"maximum", "fmax"} or (
            name == "max" and isinstance(call.func, cst.Name) and len(positional) >= 2
        ):
            # `torch.maximum(x, eps)`, `max(n, 1)`: at least the positive one.
            return any(self._positive(arg, func, depth + 1, seen) for arg in positional)
        if name == "where" and len(positional) == 3:
            chosen, other = positional[1], positional[2]
            return all(
                self._positive(branch, func, depth + 1, seen)
                or _selected_above_zero(positional[0], branch, taken)
                for branch, taken in ((chosen, True), (other, False))
            )
        subject = _subject(call, self._torch_aliases(func))
        if (
            subject is not None
            and name in {"sum", "amax", "max"}
            and self._masked_positive(subject, func, depth, seen)
        ):
            return True
        if subject is not None and (
            name in {"pow", "square", "sqrt", "cumsum", "cumprod"}
            or name in REDUCTIONS_OF_ELEMENTS | SELECTIONS | NORMS
        ):
            if name in REDUCTIONS_OF_SOME and isinstance(self._same_value(subject), cst.Name):
                # `w.sum()` after `w[-1] = 0`: the other elements keep the sum positive.
                return self._positive(subject, func, depth + 1, seen | {"[written]"})
            return self._positive(subject, func, depth + 1, seen)
        return self._call_returns_positive(call, func, depth)

    def _masked_positive(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        """``x * self.pos_mask`` with ``x`` positive and the mask fixed when the object was
        set up (see :meth:`fixed_mask`): summed over a row, it is positive. A row the mask
        leaves empty would be 0 on the first step and on every step after: a construction
        error, not a value that the data can drive to 0 (learned from static8 vissl's
        SimCLR loss, ``torch.sum(similarity * self.pos_mask, 1)``)."""
        node = self._same_value(node)
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, cst.Multiply):
            return False
        for value, mask in ((node.left, node.right), (node.right, node.left)):
            if self.fixed_mask(mask, func) and self._positive(value, func, depth + 1, seen):
                return True
        return False

    def fixed_mask(self, node: cst.BaseExpression, func: FuncInfo) -> bool:
        """``self.pos_mask``: an attribute set only outside ``func`` and outside any
        ``forward`` (at construction, or in a set-up method), to an array of 0s and 1s
        (``zeros``/``ones``/``eye``, a comparison, with elements written only to numbers
        0 or above), through casts, device moves and ``a if cond else b``."""
        node = self._same_value(node)
        text = dotted_name(node) if isinstance(node, cst.Attribute) else None
        if text is None or not text.startswith("self."):
            return False
        model = func.model or self.model
        values = model.attribute_assigns.get(attribute_key(text, func.class_name), [])
        if all(isinstance(v, cst.Name) and v.value == "None" for v in values):
            return False
        for value in values:
            if isinstance(value, cst.Name) and value.value == "None":
                continue  # a placeholder until the set-up method runs
            owner = model.function_holding(value)
            if owner is func or owner.name == "forward" or not self._mask_value(value, owner, 0):
                return False
        return True

    def _mask_value(self, node: cst.BaseExpression, func: FuncInfo, depth: int) -> bool:
        node = self._same_value(node)
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, cst.IfExp):
            return self._mask_value(node.body, func, depth + 1) and self._mask_value(
                node.orelse, func, depth + 1
            )
        if isinstance(node, cst.Comparison):
            return True
        if isinstance(node, cst.Call):
            return called_name(node) in MASK_BUILDERS
        if isinstance(node, cst.Name):
            values = func.assigns.get(node.value, [])
            return (
                bool(values)
                and all(self._mask_value(v, func, depth + 1) for v in values)
                and _element_writes_non_negative(node.value, func)
            )
        return False

    def _torch_aliases(self, func: FuncInfo) -> frozenset[str]:
        """The names the file of ``func`` imports torch (or its functional API) under."""
        model = func.model or self.model
        found = self._aliases.get(id(model))
        if found is None:
            found = self._aliases[id(model)] = frozenset(
                alias
                for alias, full in model.aliases.items()
                if full in {"torch", "torch.nn.functional"}
            )
        return found

    def _call_returns_positive(self, call: cst.Call, func: FuncInfo, depth: int) -> bool:
        """A call of a project function, method or module whose every ``return`` gives a
        positive value (``mag = stft(x)`` with ``stft`` returning a clamped magnitude)."""
        if depth >= MAX_DEPTH:
            return False
        callee = self._callee(call, func)
        if callee is None or not callee.returns or callee is func:
            return False
        # A `return None` (an early exit for a missing input) never reaches an op.
        values = [r for r in callee.returns if not (isinstance(r, cst.Name) and r.value == "None")]
        return bool(values) and all(
            not isinstance(returned, cst.Tuple)
            and self._positive(returned, callee, depth + 1, frozenset())
            for returned in values
        )

    def _name_positive(self, name: str, func: FuncInfo, depth: int, seen: frozenset[str]) -> bool:
        if name in seen:
            # `x = x.view(...)`: the earlier definitions decide; for a parameter
            # (`a = torch.tensor(a)`), what the callers pass is one of them.
            return name not in func.params or self._parameter_positive(name, func, depth)
        # `events = events.float()` of a parameter: a cast of the value passed in, which
        # says nothing of its sign (only another definition could).
        values = [
            v
            for v in func.assigns.get(name, [])
            if not (isinstance(own := self._same_value(v), cst.Name) and own.value == name)
        ]
        if not values:
            if name in func.params and name not in func.assigns:
                return self._parameter_positive(name, func, depth)
            return self._module_constant_positive(name, func, depth, seen)
        if "[written]" not in seen and _element_written(name, func):
            return False  # `w[0] = 0` after `w = torch.tensor([1.0, 2.0])`
        seen = seen | {name}
        sites = func.assign_sites.get(name, [])
        for value in values:
            index = _unpacked_index(name, value, sites)
            if index is not None:
                if not self._returned_positive(value, index, func, depth + 1):
                    return False
            elif not self._positive(value, func, depth + 1, seen):
                return False
        return True

    def _module_constant_positive(
        self, name: str, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        """``DEFAULT_MIN_WIDTH``: a name the module binds once, to a positive value (a
        constant of the file read in a function)."""
        module = (func.model or self.model).module_info
        if module is func or name in seen:
            return False
        values = module.assigns.get(name, [])
        return len(values) == 1 and self._positive(values[0], module, depth + 1, seen | {name})

    def _parameter_positive(self, name: str, func: FuncInfo, depth: int) -> bool:
        """Every caller of ``func`` in its file passes a positive ``name`` (one that omits it
        gets the default). With no caller in the file, a positive default decides: the
        parameter is a setting (``scale=3``), like every parameter of a constructor."""
        node = func.node
        if not isinstance(node, cst.FunctionDef) or depth >= MAX_DEPTH:
            return False
        default = _default_of(node, name)
        default_positive = default is not None and (
            (number_value(default) or 0) > 0
            # `min_width=DEFAULT_MIN_WIDTH`: a module constant.
            or (
                isinstance(default, cst.Name)
                and self._module_constant_positive(default.value, func, depth + 1, frozenset())
            )
        )
        callers = self.callers_of(func)
        if func.name == CONSTRUCTOR or not callers:
            return default_positive
        for call, caller in callers:
            if any(arg.star for arg in call.args):
                return False
            if func.class_name is not None and isinstance(call.func, cst.Name):
                return False  # a method called by its bare name: not a binding we read
            bound = dict(bind_arguments(call, node))
            argument = bound.get(name)
            if argument is None:
                if not default_positive:
                    return False
            elif not self._positive(argument, caller, depth + 1, frozenset()):
                return False
        return True

    def callers_of(self, func: FuncInfo) -> list[tuple[cst.Call, FuncInfo]]:
        """The calls of ``func`` in the file that defines it."""
        model = func.model or self.model
        table = self._callers.get(id(model))
        if table is None:
            table = {}
            for call, _, caller in model.all_calls:
                try:
                    callee = resolve_call(model, caller, call)
                except RecursionError:
                    callee = None
                if callee is not None:
                    table.setdefault(id(callee), []).append((call, caller))
            self._callers[id(model)] = table
        return table.get(id(func), [])

    def _attribute_positive(
        self, node: cst.Attribute, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        """``self.scale`` set only to positive values: a number, or a constructor parameter
        with a positive default (``self.scale = scale``)."""
        text = dotted_name(node)
        if text is None or text in seen or depth >= MAX_DEPTH:
            return False
        model = func.model or self.model
        values = model.attribute_assigns.get(
            attribute_key(text, func.class_name), []
        ) or _buffer_values(model, func.class_name, text)
        if not values:
            return False
        for value in values:
            owner = model.function_holding(value)
            if not self._positive(value, owner, depth + 1, seen | {text}):
                return False
        return True

    def _returned_positive(
        self, value: cst.BaseExpression, index: int, func: FuncInfo, depth: int
    ) -> bool:
        """Element ``index`` of what the called function or module returns is positive in
        every ``return`` of it."""
        if not isinstance(value, cst.Call) or depth > MAX_DEPTH:
            return False
        callee = self._callee(value, func)
        if callee is None or not callee.returns:
            return False
        for returned in callee.returns:
            if not isinstance(returned, cst.Tuple) or index >= len(returned.elements):
                return False
            element = returned.elements[index]
            if isinstance(element, cst.StarredElement):
                return False
            if not self._positive(element.value, callee, depth + 1, frozenset()):
                return False
        return True

    def _callee(self, call: cst.Call, func: FuncInfo) -> FuncInfo | None:
        """The function a call runs: a local function or method, or ``forward`` of the module
        the called object was built as (``self.vae = VAE(...)``; ``self.vae(x)``), or a
        function stored in an attribute (see :func:`loss_scope.resolve_call`)."""
        model = func.model or self.model
        try:
            target = resolve_call(model, func, call)
        except RecursionError:
            return None
        if target is not None:
            return target
        text = dotted_name(call.func)
        if text is None:
            return None
        if isinstance(call.func, cst.Name):
            built = func.assigns.get(text, []) or model.module_info.assigns.get(text, [])
        else:
            built = model.attribute_assigns.get(attribute_key(text, func.class_name), [])
        constructors = [self._same_value(v) for v in built]  # `VAE(...).to(device)`
        classes = {
            dotted_name(v.func)
            for v in constructors
            if isinstance(v, cst.Call) and dotted_name(v.func)
        }
        if len(classes) != 1:
            return None
        (class_name,) = classes
        if class_name is None or class_name not in model.class_nodes:
            return None
        return model.method_of(class_name, "forward")

    # -- non-negativity -----------------------------------------------------------------------
    def _non_negative(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        if depth > MAX_DEPTH:
            return False
        node = self._same_value(node)
        if self._positive(node, func, depth + 1, seen):
            return True
        value = number_value(node)
        if value is not None:
            return value >= 0
        if self._squared_base(node) is not None:
            return True
        if isinstance(node, cst.Call):
            name = called_name(node)
            if name in NON_NEGATIVE_CALLS:
                return True
            if name in CLAMPS:
                minimum = clamp_bound(node, "min")
                # `clamp(0, 1)`: a minimum of 0 is non-negative (not falsy).
                floor = number_value(minimum) if minimum is not None else None
                return floor is not None and floor >= 0
            subject = _subject(node, self._torch_aliases(func))
            if subject is not None and name in REDUCTIONS_OF_ELEMENTS | {"pow"}:
                # A power of a non-negative base is non-negative, whatever the exponent
                # (`leftover.pow(alpha)` with `leftover = (1 - s).clamp(0, 1)`; learned from
                # static11 DistillKit's renormalised sparse distribution).
                return self._non_negative(subject, func, depth + 1, seen)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
            return self._non_negative(node.left, func, depth + 1, seen)
        if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, cst.Add | cst.Multiply
        ):
            return self._non_negative(node.left, func, depth + 1, seen) and self._non_negative(
                node.right, func, depth + 1, seen
            )
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
            # `1 - min_width * bins` after `if min_width * bins > 1: raise ...`.
            ceiling = number_value(node.left, arithmetic=True)
            return ceiling is not None and _checked_at_most(func, node.right, ceiling)
        if isinstance(node, cst.Name) and node.value not in seen:
            values = func.assigns.get(node.value, [])
            return bool(values) and all(
                self._non_negative(v, func, depth + 1, seen | {node.value}) for v in values
            )
        return False

    # -- upper bounds -------------------------------------------------------------------------
    def below(
        self, node: cst.BaseExpression, ceiling: float, func: FuncInfo, depth: int = 0
    ) -> bool:
        """``node`` stays strictly below ``ceiling`` by construction: a clamp whose maximum is
        below it (``clamp(p, eps, 1 - eps)``), ``c - q`` with ``c <= ceiling`` and ``q``
        positive (a Dice loss ``1 - ratio`` of a smoothed ratio), ``exp`` of a negated
        positive value (below 1), a mean or maximum of such values, reached through the
        definition that reaches the read and through what a project function or module
        returns."""
        if depth > MAX_DEPTH:
            return False
        node = self._same_value(node)
        value = number_value(node, arithmetic=True)
        if value is not None:
            return value < ceiling
        if isinstance(node, cst.Name | cst.Attribute):
            reaching = reaching_value(func.model or self.model, node)
            if reaching is not None:
                return self.below(reaching, ceiling, func, depth + 1)
            if isinstance(node, cst.Name):
                values = func.assigns.get(node.value, [])
                return bool(values) and all(
                    not _mentions(v, node.value) and self.below(v, ceiling, func, depth + 1)
                    for v in values
                )
            text = dotted_name(node)
            model = func.model or self.model
            held = (
                model.attribute_assigns.get(attribute_key(text, func.class_name), [])
                or _buffer_values(model, func.class_name, text)
                if text is not None and text.startswith("self.")
                else []
            )
            return bool(held) and all(
                self.below(v, ceiling, model.function_holding(v), depth + 1) for v in held
            )
        if isinstance(node, cst.Subscript):
            return self.below(node.value, ceiling, func, depth)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
            start = number_value(node.left, arithmetic=True)
            return (
                start is not None
                and start <= ceiling
                and self._positive(node.right, func, depth + 1, frozenset())
            )
        if not isinstance(node, cst.Call):
            return False
        name = called_name(node)
        if name in CLAMPS | {"clamp_max"}:
            bound = clamp_bound(node, "max")
            return bound is not None and self.below(bound, ceiling, func, depth + 1)
        if name == "linspace":
            ends = [a.value for a in node.args if a.keyword is None][:2]
            return len(ends) == 2 and all(self.below(e, ceiling, func, depth + 1) for e in ends)
        subject = _subject(node, self._torch_aliases(func))
        if name == "cumprod" and subject is not None:
            # A running product of values in (0, 1) stays below its first factor.
            return self._positive(subject, func, depth + 1, frozenset()) and self.below(
                subject, min(ceiling, 1.0), func, depth + 1
            )
        if name in {"exp", "exp_"} and ceiling >= 1 and subject is not None:
            negated = self._same_value(subject)
            return (
                isinstance(negated, cst.UnaryOperation)
                and isinstance(negated.operator, cst.Minus)
                and self._positive(negated.expression, func, depth + 1, frozenset())
            )
        if subject is not None and name in {"mean", "amax", "max", "amin", "min"} | SELECTIONS:
            return self.below(subject, ceiling, func, depth + 1)
        callee = self._callee(node, func)
        if callee is None or callee is func or not callee.returns:
            return False
        returned = [
            r for r in callee.returns if not (isinstance(r, cst.Name) and r.value == "None")
        ]
        return bool(returned) and all(
            self.below(r, ceiling, callee, depth + 1) or _other_reduction(r, returned)
            for r in returned
        )

    # -- values no gradient flows through -----------------------------------------------------
    def gradient_free(self, node: cst.BaseExpression, func: FuncInfo) -> bool:
        """No parameter's gradient flows through ``node``: it is built only from numbers,
        settings, sampled or constant tensors (``torch.rand``, ``arange``, ``zeros_like``),
        detached values and library arithmetic on them, through local names, parameters that
        every caller fills that way, and project functions that compute from their
        arguments alone (``get_noise(t, beta_min, beta_max)`` of a sampled time).

        A root's infinite slope at 0 matters only where a gradient is taken: a noise
        schedule ``sqrt(1 - exp(-cum_noise))`` of a sampled diffusion time is a constant for
        autograd (learned from static9 Grad-TTS)."""
        return self._gradient_free(node, func, 0, frozenset(), frozenset())

    def _gradient_free(
        self,
        node: cst.BaseExpression,
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        free_params: frozenset[str],
    ) -> bool:
        if depth > 2 * MAX_DEPTH:
            return False
        if number_value(node) is not None or isinstance(
            node, cst.SimpleString | cst.ConcatenatedString | cst.FormattedString
        ):
            return True

        def free(value: cst.BaseExpression) -> bool:
            # Sub-expressions: the tree bounds them; only definitions and calls count depth.
            return self._gradient_free(value, func, depth, seen, free_params)

        if isinstance(node, cst.Comparison):
            return True  # booleans carry no gradient
        if isinstance(node, cst.UnaryOperation):
            return free(node.expression)
        if isinstance(node, cst.BinaryOperation):
            return free(node.left) and free(node.right)
        if isinstance(node, cst.IfExp):
            return free(node.body) and free(node.orelse)
        if isinstance(node, cst.Subscript):
            return free(node.value)
        if isinstance(node, cst.List | cst.Tuple):
            return all(isinstance(e, cst.Element) and free(e.value) for e in node.elements)
        if isinstance(node, cst.Attribute):
            if node.attr.value in DETACHED_ATTRIBUTES:
                return True
            if dotted_name(node.value) in MATH_MODULES:
                return True  # `math.pi`, `np.e`
            if not (dotted_name(node) or "").startswith("self."):
                return free(node.value) and node.attr.value in TENSOR_PROPERTIES
            return self._setting_free(node, func, depth, seen)
        if isinstance(node, cst.Name):
            return self._name_free(node, func, depth, seen, free_params)
        if isinstance(node, cst.Call):
            return self._call_free(node, func, depth, seen, free_params)
        return False

    def _name_free(
        self,
        node: cst.Name,
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        free_params: frozenset[str],
    ) -> bool:
        name = node.value
        if name in free_params or name in {"True", "False", "None"}:
            return True
        reaching = reaching_value(func.model or self.model, node)
        if reaching is not None:
            return self._gradient_free(reaching, func, depth + 1, seen, free_params)
        key = f"{id(func)}:{name}"
        if key in seen:
            return True  # `t = t.unsqueeze(-1)`: the other definitions decide
        values = func.assigns.get(name, [])
        sites = func.assign_sites.get(name, [])
        if values:
            if any(_unpacked_index(name, v, sites) is not None for v in values):
                return False
            if any(isinstance(site, cst.AugAssign) for site in sites):
                return False
            inner = seen | {key}
            if not all(self._gradient_free(v, func, depth + 1, inner, free_params) for v in values):
                return False
            return name not in func.params or self._parameter_free(name, func, depth)
        if name in func.params:
            return self._parameter_free(name, func, depth)
        module = (func.model or self.model).module_info
        constants = module.assigns.get(name, [])
        return (
            module is not func
            and len(constants) == 1
            and self._gradient_free(constants[0], module, depth + 1, seen | {key}, frozenset())
        )

    def _parameter_free(self, name: str, func: FuncInfo, depth: int) -> bool:
        """Every caller of ``func`` in its file passes a gradient-free ``name`` (a caller that
        leaves it out gets the default)."""
        node = func.node
        if not isinstance(node, cst.FunctionDef) or depth >= 2 * MAX_DEPTH:
            return False
        default = _default_of(node, name)
        callers = self.callers_of(func)
        if not callers:
            # No caller in the file: a numeric default says the parameter is a setting.
            return default is not None and number_value(default, arithmetic=True) is not None
        for call, caller in callers:
            if any(arg.star for arg in call.args):
                return False
            argument = dict(bind_arguments(call, node)).get(name)
            if argument is None:
                if default is None or not self._gradient_free(
                    default, func, depth + 1, frozenset(), frozenset()
                ):
                    return False
            elif not self._gradient_free(argument, caller, depth + 1, frozenset(), frozenset()):
                return False
        return True

    def _setting_free(
        self, node: cst.Attribute, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        """``self.beta_min``: every assignment of the attribute is gradient-free, where a
        constructor's parameter is a setting (a number the object was configured with)."""
        text = dotted_name(node)
        if text is None or text in seen:
            return text is not None
        model = func.model or self.model
        values = model.attribute_assigns.get(attribute_key(text, func.class_name), [])
        values = values or _unpacked_attribute_values(model, func.class_name, text)
        if not values:
            # A registered buffer: never a parameter, never differentiated (learned from the
            # schedules DDPM code keeps as buffers: `sqrt(1 - alphas_cumprod[t])`).
            return bool(_buffer_values(model, func.class_name, text))
        for value in values:
            owner = model.function_holding(value)
            if (
                owner.name == CONSTRUCTOR
                and isinstance(value, cst.Name)
                and value.value in owner.params
                and value.value not in owner.assigns
            ):
                continue
            if not self._gradient_free(
                value, owner, depth + 1, seen | {text}, _constructor_data(owner)
            ):
                return False
        return True

    def _call_free(
        self,
        call: cst.Call,
        func: FuncInfo,
        depth: int,
        seen: frozenset[str],
        free_params: frozenset[str],
    ) -> bool:
        name = called_name(call)
        for arg in call.args:
            if (
                arg.keyword is not None
                and arg.keyword.value == "requires_grad"
                and not (isinstance(arg.value, cst.Name) and arg.value.value == "False")
            ):
                return False
        if name in {"requires_grad_", "Parameter"} or name in GRADIENT_READERS:
            return False
        if name in DETACHING_CALLS or name in SAMPLED_OR_CONSTANT:
            return True
        arguments = [arg.value for arg in call.args]
        text = dotted_name(call.func) or ""
        head = text.split(".", 1)[0]
        library = head in LIBRARY_HEADS or head in self._torch_aliases(func)
        if library and name[:1].islower():
            return all(self._gradient_free(a, func, depth, seen, free_params) for a in arguments)
        if isinstance(call.func, cst.Attribute) and not library:
            owner = call.func.value
            if not (dotted_name(owner) or "").startswith("self") and self._gradient_free(
                owner, func, depth, seen, free_params
            ):
                # A tensor method of a gradient-free tensor (`t.unsqueeze(-1)`).
                return all(
                    self._gradient_free(a, func, depth, seen, free_params) for a in arguments
                )
        callee = self._callee(call, func) or self._only_method(call, func)
        if (
            callee is None
            or callee is func
            or not callee.returns
            or callee.name in FORWARD_METHODS
            or not isinstance(callee.node, cst.FunctionDef)
        ):
            return False
        # A project function computing from its arguments: free where they are.
        bound = dict(bind_arguments(call, callee.node))
        if any(arg.star for arg in call.args):
            return False
        free = frozenset(
            param
            for param, value in bound.items()
            if self._gradient_free(value, func, depth, seen, free_params)
        )
        return all(
            self._gradient_free(r, callee, depth + 1, frozenset(), free) for r in callee.returns
        )

    def _only_method(self, call: cst.Call, func: FuncInfo) -> FuncInfo | None:
        """``model.schedule.variance(t)`` on an object whose class the analyser cannot see:
        the one method of that name in the file, when exactly one class defines it (a noise
        schedule's ``snr``). Read only to ask whether the call computes from its arguments
        alone, which a wrong match could only make less certain, never a gradient appear."""
        if not isinstance(call.func, cst.Attribute):
            return None
        name = call.func.attr.value
        model = func.model or self.model
        found = [info for (_, method), info in model.methods.items() if method == name]
        return found[0] if len(found) == 1 else None

    # -- gradients ------------------------------------------------------------------------------
    def _autograd_gradient(
        self, node: cst.BaseExpression, func: FuncInfo, depth: int, seen: frozenset[str]
    ) -> bool:
        """``node`` holds a gradient from ``torch.autograd.grad(...)`` (reshaped or indexed)."""
        if depth > MAX_DEPTH:
            return False
        node = self._same_value(node)
        while isinstance(node, cst.Subscript):
            node = self._same_value(node.value)
        if isinstance(node, cst.Call):
            return (dotted_name(node.func) or "").endswith("autograd.grad")
        if isinstance(node, cst.Name):
            if node.value in seen:
                return True
            values = func.assigns.get(node.value, [])
            return bool(values) and all(
                self._autograd_gradient(v, func, depth + 1, seen | {node.value}) for v in values
            )
        return False

    @staticmethod
    def _squared_base(node: cst.BaseExpression) -> cst.BaseExpression | None:
        """``x`` for ``x ** 2``, ``x.pow(2)``, ``torch.pow(x, 2)``, ``x.square()``."""
        node = Positivity._same_value(node)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
            return node.left if number_value(node.right) == 2 else None
        if isinstance(node, cst.Call):
            name = called_name(node)
            subject = _subject(node)
            if name == "square":
                return subject
            if name == "pow" and subject is not None:
                exponent = _exponent(node)
                return subject if exponent is not None and number_value(exponent) == 2 else None
        return None

    @staticmethod
    def _same_value(node: cst.BaseExpression) -> cst.BaseExpression:
        """``x`` for ``x.float()``, ``x.view(...)`` and friends (every element keeps its
        value)."""
        while (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in SAME_VALUE_METHODS
        ):
            node = node.func.value
        return node


def _exponentiated(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """``x`` for ``torch.exp(x)`` / ``x.exp()``."""
    if not isinstance(node, cst.Call) or called_name(node) not in {"exp", "exp_"}:
        return None
    return _subject(node)


def _added(
    call: cst.Call, positional: list[cst.BaseExpression], aliases: frozenset[str]
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two terms of ``a.add(b)`` / ``torch.add(a, b)`` (None for anything else, and
    for an ``alpha`` that scales the second term)."""
    if called_name(call) not in {"add", "add_"} or any(arg.keyword for arg in call.args):
        return None
    if not isinstance(call.func, cst.Attribute):
        return None
    head = dotted_name(call.func.value)
    if head in LIBRARY_HEADS or head in aliases:
        return (positional[0], positional[1]) if len(positional) == 2 else None
    return (call.func.value, positional[0]) if len(positional) == 1 else None


def _positive_bound(bound: cst.BaseExpression | None) -> bool:
    """A lower bound above 0: a positive literal or an epsilon-named constant."""
    if bound is None:
        return False
    value = number_value(bound)
    if value is not None:
        return value > 0
    return isinstance(bound, cst.Name | cst.Attribute) and offset_name(_last_part(bound))


CASTS = frozenset({"float", "double", "half", "to", "type_as", "type", "bool", "int", "long"})


def _cast_free(node: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` for ``x.float()`` / ``x.to(dtype)`` (any number of casts): the same values."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in CASTS
    ):
        node = node.func.value
    return node


def _epsilon(node: cst.BaseExpression) -> bool:
    """A positive constant: a number above 0 or a name for an offset (``eps``)."""
    value = number_value(node, arithmetic=True)
    if value is not None:
        return value > 0
    if isinstance(node, cst.Name):
        return offset_name(node.value)
    if isinstance(node, cst.Attribute):
        return offset_name(node.attr.value)
    return False


def _constructor_data(owner: FuncInfo) -> frozenset[str]:
    """The parameters of a constructor that an attribute's value may be built from and stay
    fixed: what the object was made with (domain bounds, a data tensor), never reassigned in
    it. A Parameter or a module call made from them is still caught by the call itself
    (learned from a PINN's input scaling by bounds taken from its collocation points)."""
    if owner.name != CONSTRUCTOR:
        return frozenset()
    return frozenset(p for p in owner.params if p != "self" and p not in owner.assigns)


def _default_of(node: cst.FunctionDef, name: str) -> cst.BaseExpression | None:
    """The default of parameter ``name`` of ``node``."""
    params = node.params
    for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
        if param.name.value == name:
            return param.default
    return None


def _unpacked_attribute_values(
    model: FileModel, class_name: str | None, text: str
) -> list[cst.BaseExpression]:
    """The values ``self.a, self.b = a, b`` gives ``text`` in the methods of ``class_name``
    (element by element; the file model records only single-target attributes)."""
    found: list[cst.BaseExpression] = []
    for func in model.functions:
        if func.class_name != class_name or not isinstance(func.node, cst.FunctionDef):
            continue
        for node in walk(func.node):
            if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Tuple):
                continue
            for target in node.targets:
                if not isinstance(target.target, cst.Tuple):
                    continue
                elements = target.target.elements
                if len(elements) != len(node.value.elements):
                    continue
                for element, value in zip(elements, node.value.elements, strict=True):
                    if dotted_name(element.value) == text and isinstance(value, cst.Element):
                        found.append(value.value)
    return found


def _buffer_values(model: FileModel, class_name: str | None, text: str) -> list[cst.BaseExpression]:
    """The values ``self.register_buffer("name", value)`` gives ``self.name`` in the methods of
    ``class_name``: a module's constants (a diffusion schedule's ``alphas_cumprod``), which
    autograd never differentiates."""
    if class_name is None or not text.startswith("self.") or text.count(".") != 1:
        return []
    attribute = text.split(".", 1)[1]
    found: list[cst.BaseExpression] = []
    for func in model.functions:
        if func.class_name != class_name or not isinstance(func.node, cst.FunctionDef):
            continue
        for node in walk(func.node):
            if (
                isinstance(node, cst.Call)
                and called_name(node) == "register_buffer"
                and len(node.args) >= 2
                and isinstance(node.args[0].value, cst.SimpleString)
                and node.args[0].value.evaluated_value == attribute
            ):
                found.append(node.args[1].value)
    return found


def _selected_above_zero(
    condition: cst.BaseExpression, branch: cst.BaseExpression, taken: bool
) -> bool:
    """``torch.where(p < 1e-6, floor, p)``: the branch is the compared value itself, and
    the condition (true for the first branch, false for the second) keeps only values above
    0 there (``p >= 1e-6``, ``p > 0``)."""
    if not isinstance(condition, cst.Comparison) or len(condition.comparisons) != 1:
        return False
    target = condition.comparisons[0]
    bound = number_value(target.comparator, arithmetic=True)
    if bound is None or code_of(condition.left) != code_of(branch):
        return False
    symbol = {
        cst.LessThan: "<",
        cst.LessThanEqual: "<=",
        cst.GreaterThan: ">",
        cst.GreaterThanEqual: ">=",
    }.get(type(target.operator))
    if not taken:  # the second branch sees the negated condition
        symbol = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}.get(symbol or "")
    if symbol == ">":
        return bound >= 0
    if symbol == ">=":
        return bound > 0
    return False


def _mentions(node: cst.BaseExpression, name: str) -> bool:
    """``node`` reads the local name ``name``."""
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node))


def _other_reduction(value: cst.BaseExpression, returned: list[cst.BaseExpression]) -> bool:
    """``loss.sum()`` returned next to ``loss.mean()`` (or ``loss`` itself) of the same
    function: a ``reduction`` setting picks how one per-element value is reduced, and its
    bound is the per-element one; the sum is the caller's explicit choice."""
    if not isinstance(value, cst.Call) or called_name(value) != "sum":
        return False
    subject = _subject(value)
    if subject is None:
        return False
    text = code_of(subject)
    return any(
        code_of(other) == text
        or (
            isinstance(other, cst.Call)
            and called_name(other) == "mean"
            and (inner := _subject(other)) is not None
            and code_of(inner) == text
        )
        for other in returned
        if other is not value
    )


def _element_written(name: str, func: FuncInfo) -> bool:
    """``name[...] = ...`` somewhere in ``func``: one element set after the array was made."""
    written = func.__dict__.get("_element_writes")
    if written is None:
        written = set()
        for node in walk(func.node) if isinstance(func.node, cst.FunctionDef) else ():
            if isinstance(node, cst.Assign | cst.AugAssign):
                targets = (
                    [t.target for t in node.targets]
                    if isinstance(node, cst.Assign)
                    else [node.target]
                )
                for target in targets:
                    if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
                        written.add(target.value.value)
        func.__dict__["_element_writes"] = written
    return name in written


def _checked_at_most(func: FuncInfo, node: cst.BaseExpression, ceiling: float) -> bool:
    """The function refuses ``node`` above ``ceiling`` before it goes on: ``if node >
    ceiling: raise ...`` (or ``>=``) at the top level of its body, or ``assert node <=
    ceiling`` (or ``<``). The code of ``node`` is compared as written."""
    if not isinstance(func.node, cst.FunctionDef):
        return False
    text = code_of(node)
    for stmt in func.node.body.body:
        if (
            isinstance(stmt, cst.If)
            and _raises(stmt.body)
            and _compares(stmt.test, text, ceiling, (cst.GreaterThan, cst.GreaterThanEqual))
        ):
            return True
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assert) and _compares(
                    small.test, text, ceiling, (cst.LessThan, cst.LessThanEqual)
                ):
                    return True
    return False


def _raises(block: cst.BaseSuite) -> bool:
    """The block raises an exception (its statements, first level)."""
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    return any(
        isinstance(line, cst.SimpleStatementLine | cst.SimpleStatementSuite)
        and any(isinstance(small, cst.Raise) for small in line.body)
        for line in statements
    )


def _compares(
    test: cst.BaseExpression,
    text: str,
    ceiling: float,
    operators: tuple[type[cst.BaseCompOp], ...],
) -> bool:
    """``test`` is ``<text> OP <number at most ceiling>`` (one comparison)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    bound = number_value(target.comparator, arithmetic=True)
    return (
        isinstance(target.operator, operators)
        and bound is not None
        and bound <= ceiling
        and code_of(test.left) == text
    )


def _element_writes_non_negative(name: str, func: FuncInfo) -> bool:
    """Every ``name[...] = v`` in ``func`` writes a number of 0 or more."""
    for node in walk(func.node) if isinstance(func.node, cst.FunctionDef) else ():
        if isinstance(node, cst.AugAssign) and _names_element(node.target, name):
            return False
        if isinstance(node, cst.Assign) and any(
            _names_element(t.target, name) for t in node.targets
        ):
            value = number_value(node.value)
            if value is None or value < 0:
                return False
    return True


def _names_element(target: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and target.value.value == name
    )


def _last_part(node: cst.Name | cst.Attribute) -> str:
    return node.value if isinstance(node, cst.Name) else node.attr.value


LIBRARY_OWNERS = frozenset(
    {"torch", "th", "F", "torch.nn.functional", "nn.functional", "math", "np"}
)


def _subject(call: cst.Call, aliases: frozenset[str] = frozenset()) -> cst.BaseExpression | None:
    """The tensor a call works on: ``x`` in ``x.sum()`` and in ``torch.sum(x)`` (``T.sum(x)``
    with ``T`` among ``aliases``, the file's other names for torch)."""
    if isinstance(call.func, cst.Attribute):
        owner = dotted_name(call.func.value)
        if owner in LIBRARY_OWNERS or owner in aliases:
            return call.args[0].value if call.args and call.args[0].keyword is None else None
        return call.func.value
    return call.args[0].value if call.args and call.args[0].keyword is None else None


def _exponent(call: cst.Call) -> cst.BaseExpression | None:
    """The exponent of ``x.pow(e)`` / ``torch.pow(x, e)``."""
    positional = [a.value for a in call.args if a.keyword is None]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "exponent":
            return arg.value
    owner = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
    if owner in {"torch", "th"} or isinstance(call.func, cst.Name):
        return positional[1] if len(positional) > 1 else None
    return positional[0] if positional else None


def exponent_of(node: cst.BaseExpression) -> tuple[cst.BaseExpression, float] | None:
    """(base, exponent) for ``x ** e`` / ``x.pow(e)`` / ``torch.pow(x, e)`` with a literal
    exponent."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        value = number_value(node.right, arithmetic=True)
        return None if value is None else (node.left, value)
    if isinstance(node, cst.Call) and called_name(node) == "pow":
        subject = _subject(node)
        exponent = _exponent(node)
        if subject is None or exponent is None:
            return None
        value = number_value(exponent, arithmetic=True)
        return None if value is None else (subject, value)
    return None


FUNCTION_OWNERS = frozenset({"torch", "th", "np", "numpy"})
"""Modules whose ``clamp`` / ``clip`` take the tensor first (``torch.clamp(x, lo, hi)``,
``np.clip(x, lo, hi)``)."""


def clamp_bound(call: cst.Call, side: Literal["min", "max"]) -> cst.BaseExpression | None:
    """The lower (``side="min"``) or upper bound of a clamp: ``x.clamp(lo, hi)``,
    ``torch.clamp(x, lo, hi)``, ``np.clip(x, lo, hi)``, ``clamp(x, min=lo)``,
    ``x.clamp_min(lo)``, ``x.clamp_max(hi)``; None when the call sets no such bound."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == side:
            return arg.value
    name = called_name(call)
    if name in {"clamp_min", "clamp_min_"} and side == "max":
        return None
    if name in {"clamp_max", "clamp_max_"} and side == "min":
        return None
    positional = [a.value for a in call.args if a.keyword is None]
    owner = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
    # `torch.clamp(x, lo)` / a bare `clamp(x, lo)`: the tensor comes first.
    index = 1 if owner in FUNCTION_OWNERS or isinstance(call.func, cst.Name) else 0
    if side == "max" and name not in {"clamp_max", "clamp_max_"}:
        index += 1
    return positional[index] if len(positional) > index else None


def _unpacked_index(name: str, value: cst.BaseExpression, sites: list[cst.CSTNode]) -> int | None:
    """The position of ``name`` in the tuple target that received ``value`` (``a, b = f()``),
    or None for a plain assignment."""
    for site in sites:
        if not isinstance(site, cst.Assign) or site.value is not value:
            continue
        for target in site.targets:
            if isinstance(target.target, cst.Tuple | cst.List):
                for index, element in enumerate(target.target.elements):
                    if isinstance(element.value, cst.Name) and element.value.value == name:
                        return index
    return None


# -- reaching definitions -----------------------------------------------------------------------
LOOPS = (cst.For, cst.While)


def reaching_value(model: FileModel, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The value that ``node`` (a name or ``self.x`` read in ``model``) holds where it is read:
    the last plain assignment to it before the reading statement in straight-line code,
    climbing out of ``if`` / ``with`` blocks (what is assigned before them still reaches).
    None when an assignment inside an earlier compound statement, an in-place update, a
    loop around the read that assigns it, or the start of the function comes first: the
    caller then judges every definition of the name.

    Real code reassigns one name step by step (``output = torch.sigmoid(output)``, then
    ``output = torch.clamp(output, eps, 1 - eps)``): only the last step says what the value is
    where it is used (learned from static9 Loss_ToolBox, whose ``log(1.0 - output)`` reads
    the clamped value)."""
    if not isinstance(node, cst.Name | cst.Attribute):
        return None
    text = dotted_name(node)
    if text is None:
        return None
    current: cst.CSTNode = node
    for parent in model.ancestors(node):
        if isinstance(parent, cst.FunctionDef | cst.Lambda | cst.ClassDef | cst.Module):
            return None
        if isinstance(parent, cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp):
            return None
        if isinstance(parent, LOOPS) and _assigns(parent, text):
            return None  # an assignment later in the loop reaches the next iteration
        if isinstance(parent, cst.IndentedBlock):
            statements = list(parent.body)
            index = next((i for i, s in enumerate(statements) if s is current), None)
            if index is None:
                return None
            for earlier in reversed(statements[:index]):
                found = _assignment_in(earlier, text)
                if found is not None:
                    return found if isinstance(found, cst.BaseExpression) else None
        current = parent
    return None


def _assignment_in(stmt: cst.CSTNode, text: str) -> cst.BaseExpression | bool | None:
    """The value ``stmt`` assigns to ``text`` as a whole statement (``x = v``); True when it
    changes ``text`` otherwise (an in-place update, a tuple target, a compound statement that
    assigns it); None when it leaves it alone."""
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in reversed(stmt.body):
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if dotted_name(target.target) == text:
                        return small.value
                if _assigns(small, text):
                    return True
            elif isinstance(small, cst.AnnAssign | cst.AugAssign) and _assigns(small, text):
                return True
        return None
    return True if _assigns(stmt, text) else None


def _assigns(node: cst.CSTNode, text: str) -> bool:
    """Something inside ``node`` binds or updates ``text``."""
    for inner in walk(node):
        targets: list[cst.BaseExpression] = []
        if isinstance(inner, cst.Assign):
            targets = [t.target for t in inner.targets]
        elif isinstance(inner, cst.AnnAssign | cst.AugAssign | cst.For | cst.CompFor):
            targets = [inner.target]
        elif isinstance(inner, cst.AsName):
            targets = [inner.name] if isinstance(inner.name, cst.BaseExpression) else []
        for target in targets:
            for part in walk(target):
                if isinstance(part, cst.Name | cst.Attribute) and dotted_name(part) == text:
                    return True
    return False
