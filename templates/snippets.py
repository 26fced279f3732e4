"""Fix snippets: short, correct PyTorch code rendered with the user's own names.

Each snippet is one Jinja2 template, ``templates/snippets/<id>.py.j2``. The registry is
discovered from those files, so there is no second list to keep in step:

* the id is the file name;
* title, description, ``runnable``, the related catalogue ids and any parameters that only
  this snippet has come from a YAML block inside the template's opening ``{#- ... -#}``
  comment;
* the parameters a snippet takes are the variables its template actually uses (found by
  Jinja2's own parser), each one either a standard parameter (:data:`STANDARD_PARAMETERS`) or
  one declared in the YAML block.

Values are inserted into code, so every value is checked before rendering: a name must be a
Python identifier or a dotted name (``self.model``), a number must be a plain numeric literal.
"""

from __future__ import annotations

import ast
import difflib
import keyword
import math
import re
import unicodedata
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib import resources
from typing import Literal

import jinja2
import jinja2.meta
import yaml
from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.templates import environment

__all__ = [
    "STANDARD_PARAMETERS",
    "ParameterKind",
    "SnippetParameter",
    "SnippetSpec",
    "get_snippet",
    "list_snippets",
    "render_snippet",
]

SNIPPET_DIR = "snippets"
SNIPPET_SUFFIX = ".py.j2"

ParameterKind = Literal["name", "number", "count", "integer", "string"]
"""What a parameter's value may be.

``name``: an identifier or dotted name. ``number``: a positive finite number or a name.
``count``: a positive integer or a name. ``integer``: any integer or a name. ``string``: a
quoted string literal such as ``"cuda"``, a known device word (``cpu``, ``cuda``, ``mps``...,
quoted for you) or a name holding such a string.
"""

_FRONT_MATTER = re.compile(r"\A\{#-?(?P<body>.*?)-?#\}", re.DOTALL)
_IDENTIFIER_CHAIN = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")
_DEVICE_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_KNOWN_DEVICE_TYPES = frozenset({"cpu", "cuda", "mps", "xpu", "hpu", "mtia", "xla", "meta"})


class SnippetParameter(BaseModel):
    """One name a snippet can be rendered with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: str = Field(description="The text inserted when the caller gives no value.")
    description: str = Field(description="What the value stands for, in one line.")
    kind: ParameterKind = Field(default="name", description="Which values are accepted.")


STANDARD_PARAMETERS: dict[str, SnippetParameter] = {
    "model": SnippetParameter(default="model", description="the nn.Module being trained"),
    "optimizer": SnippetParameter(default="optimizer", description="the torch.optim optimizer"),
    "loss": SnippetParameter(default="loss", description="the variable holding the loss tensor"),
    "criterion": SnippetParameter(
        default="criterion", description="the loss function called as criterion(output, target)"
    ),
    "scaler": SnippetParameter(default="scaler", description="the torch.amp.GradScaler"),
    "loader": SnippetParameter(
        default="train_loader", description="the iterable of (inputs, targets) micro-batches"
    ),
    "scheduler": SnippetParameter(default="scheduler", description="the LR scheduler"),
    "accumulation_steps": SnippetParameter(
        default="accumulation_steps",
        description="micro-batches per optimizer step (a name or a positive integer)",
        kind="count",
    ),
    "max_norm": SnippetParameter(
        default="1.0", description="the gradient-norm clipping threshold", kind="number"
    ),
    "device_type": SnippetParameter(
        default='"cuda"',
        description="device type for autocast and GradScaler: a string such as cuda or cpu",
        kind="string",
    ),
    "dtype": SnippetParameter(
        default="torch.bfloat16", description="the autocast dtype (torch.bfloat16 or torch.float16)"
    ),
    "inputs": SnippetParameter(default="inputs", description="the model input of a micro-batch"),
    "targets": SnippetParameter(default="targets", description="the targets of a micro-batch"),
    "step": SnippetParameter(default="step", description="the batch index within the epoch"),
    "epoch": SnippetParameter(default="epoch", description="the epoch counter"),
    "trainer": SnippetParameter(default="trainer", description="the Lightning Trainer"),
}


class SnippetSpec(BaseModel):
    """What a fix snippet is, which names it takes and whether it is proven by running it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Stable snippet id (the template's file name).")
    title: str
    description: str
    parameters: dict[str, SnippetParameter] = Field(
        description="The names this snippet is rendered with: name -> default and meaning."
    )
    runnable: bool = Field(
        description="True when the rendered code runs as-is on a small CPU model (tested)."
    )
    related: list[str] = Field(description="Catalogue ids (red flags, signals...) it fixes.")


class _FrontMatter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str
    description: str
    runnable: bool
    related: list[str] = Field(default_factory=list)
    parameters: dict[str, SnippetParameter] = Field(default_factory=dict)


def _template_name(snippet_id: str) -> str:
    return f"{SNIPPET_DIR}/{snippet_id}{SNIPPET_SUFFIX}"


def _snippet_ids_on_disk() -> list[str]:
    folder = resources.files("gradient_doctor.templates").joinpath(SNIPPET_DIR)
    return sorted(
        entry.name.removesuffix(SNIPPET_SUFFIX)
        for entry in folder.iterdir()
        if entry.name.endswith(SNIPPET_SUFFIX)
    )


def _load_spec(snippet_id: str) -> SnippetSpec:
    env = environment()
    assert env.loader is not None
    source, _, _ = env.loader.get_source(env, _template_name(snippet_id))
    found = _FRONT_MATTER.match(source)
    if found is None:
        raise RuntimeError(f"snippet {snippet_id!r} has no opening {{#- ... -#}} metadata block")
    meta = _FrontMatter.model_validate(yaml.safe_load(found.group("body")))

    used = jinja2.meta.find_undeclared_variables(env.parse(source))
    clash = sorted(set(meta.parameters) & set(STANDARD_PARAMETERS))
    if clash:
        raise RuntimeError(f"snippet {snippet_id!r} redeclares standard parameters: {clash}")
    unknown = sorted(used - set(STANDARD_PARAMETERS) - set(meta.parameters))
    if unknown:
        raise RuntimeError(f"snippet {snippet_id!r} uses undeclared parameters: {unknown}")
    unused = sorted(set(meta.parameters) - used)
    if unused:
        raise RuntimeError(f"snippet {snippet_id!r} declares parameters it never uses: {unused}")

    available = {**STANDARD_PARAMETERS, **meta.parameters}
    # Keep the standard table's order so every snippet lists its names the same way.
    parameters = {name: spec for name, spec in available.items() if name in used}
    return SnippetSpec(
        id=snippet_id,
        title=meta.title,
        description=" ".join(meta.description.split()),
        parameters=parameters,
        runnable=meta.runnable,
        related=meta.related,
    )


@cache
def _spec(snippet_id: str) -> SnippetSpec:
    return _load_spec(snippet_id)


@lru_cache(maxsize=1)
def _known_ids() -> frozenset[str]:
    return frozenset(_snippet_ids_on_disk())


@lru_cache(maxsize=1)
def _registry() -> dict[str, SnippetSpec]:
    return {snippet_id: _spec(snippet_id) for snippet_id in _snippet_ids_on_disk()}


def list_snippets() -> list[SnippetSpec]:
    """Every fix snippet shipped with the package, sorted by id."""
    return list(_registry().values())


def get_snippet(snippet_id: str) -> SnippetSpec:
    """The spec of one snippet; ``KeyError`` naming the closest ids when it does not exist.

    Only that snippet's template is read and checked (a report that shows two snippets does
    not parse all twenty); :func:`list_snippets` checks every one."""
    if snippet_id in _known_ids():
        return _spec(snippet_id)
    registry = _registry()
    try:
        return registry[snippet_id]
    except KeyError:
        closest = difflib.get_close_matches(snippet_id, list(registry), n=3, cutoff=0.3)
        hint = f"closest: {', '.join(closest)}" if closest else f"known: {', '.join(registry)}"
        raise KeyError(f"unknown snippet id {snippet_id!r}; {hint}") from None


def _is_dotted_name(text: str) -> bool:
    # Python folds identifiers to NFKC ("º" is read as "o"): accept only text that already is
    # in that form, so the name in the code is the name the caller wrote.
    if not _IDENTIFIER_CHAIN.fullmatch(text) or unicodedata.normalize("NFKC", text) != text:
        return False
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in text.split("."))


def _numeric_literal(value: str | int | float) -> int | float | None:
    """The number ``value`` spells, or None when it is not a plain numeric literal."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(parsed, bool) or not isinstance(parsed, int | float):
        return None
    return parsed


def _code_for(name: str, kind: ParameterKind, value: str | int | float) -> str:
    """Validate ``value`` for a parameter of ``kind`` and return the text to insert."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{name}={value!r} must be a string or a number")
    if isinstance(value, str) and _is_dotted_name(value.strip()):
        bare = value.strip()
        # A bare device word is meant as the device string, not as a variable of that name.
        if kind == "string" and bare in _KNOWN_DEVICE_TYPES:
            return f'"{bare}"'
        return bare
    if kind in {"number", "count", "integer"}:
        number = _numeric_literal(value)
        if number is not None and math.isfinite(number):
            if kind == "number" and number > 0:
                return repr(number)
            if kind == "count" and isinstance(number, int) and number > 0:
                return str(number)
            if kind == "integer" and isinstance(number, int):
                return str(number)
        wanted = {
            "number": "a positive number",
            "count": "a positive integer",
            "integer": "an integer",
        }[kind]
        raise ValueError(f"{name}={value!r} is not {wanted} or a Python name")
    if kind == "string" and isinstance(value, str):
        try:
            literal = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            literal = None
        if isinstance(literal, str) and _DEVICE_WORD.fullmatch(literal):
            return f'"{literal}"'
        raise ValueError(
            f'{name}={value!r} is not a quoted device type (such as "cuda"), '
            "a known device word (cpu, cuda, mps...) or a Python name"
        )
    raise ValueError(
        f"{name}={value!r} is not a Python identifier or dotted name (such as self.model)"
    )


def render_snippet(snippet_id: str, names: Mapping[str, str | int | float] | None = None) -> str:
    """Render fix snippet ``snippet_id`` with the user's names.

    ``names`` maps parameter names (see :data:`STANDARD_PARAMETERS` and the snippet's
    ``parameters``) to the user's identifiers, e.g. ``{"model": "net", "max_norm": 0.5}``.
    Standard parameters that this snippet does not use are accepted and ignored, so one
    mapping of the user's names can be passed to every snippet.

    Raises ``KeyError`` for an unknown snippet id (naming the closest ids) and ``ValueError``
    for an unknown parameter (naming the accepted ones) or a value that is not a valid name
    or number.
    """
    spec = get_snippet(snippet_id)
    names = dict(names or {})
    unknown = sorted(set(names) - set(STANDARD_PARAMETERS) - set(spec.parameters))
    if unknown:
        accepted = ", ".join(spec.parameters) or "(none)"
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for snippet {snippet_id!r}; "
            f"it accepts: {accepted}"
        )
    context: dict[str, str] = {}
    for name, value in names.items():
        kind = (spec.parameters.get(name) or STANDARD_PARAMETERS[name]).kind
        context[name] = _code_for(name, kind, value)
    for name, parameter in spec.parameters.items():
        context.setdefault(name, parameter.default)
    try:
        template = environment().get_template(_template_name(snippet_id))
        rendered = template.render(**context)
    except jinja2.TemplateError as error:  # a packaging bug, not the caller's fault
        raise RuntimeError(f"snippet {snippet_id!r} failed to render: {error}") from error
    return rendered.lstrip("\n")
