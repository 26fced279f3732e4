"""Gradient accumulation in a Hugging Face ``Trainer`` subclass whose ``compute_loss`` returns a
per-micro-batch mean and ignores ``num_items_in_batch``.

What ``Trainer.training_step`` does with the loss ``compute_loss`` returns, read in each
release's ``transformers/trainer.py`` (``training_step``, ``create_accelerator_and_postprocess``):

* up to 4.45: the Accelerator is built with ``num_steps=gradient_accumulation_steps`` and its
  ``backward`` divides by it; ``compute_loss`` gets no ``num_items_in_batch``: a mean is right;
* 4.46.0: ``loss *= gradient_accumulation_steps`` before that dividing ``backward``, for every
  model; 4.46.1 to 4.47.x: the Accelerator counts no accumulation and ``training_step`` does not
  divide: in both, no division at all, whatever the model;
* 4.48.0 onward (5.24 included): the Accelerator counts no accumulation, and ``training_step``
  divides by the count only when the loss is not already normalised by the token count of the
  whole window: 4.48 ``if num_items_in_batch is None``, 4.49 ``if not
  self.model_accepts_loss_kwargs and self.compute_loss_func is None``, 4.50+ ``if (not
  self.model_accepts_loss_kwargs or num_items_in_batch is None) and self.compute_loss_func is
  None``. ``model_accepts_loss_kwargs`` is the model's ``accepts_loss_kwargs`` or, without one,
  whether its ``forward`` takes ``**kwargs`` (every causal LM of the library does);
  ``num_items_in_batch`` is counted from the labels when the model accepts loss kwargs;
* 5.19 onward adds ``Trainer.loss_is_scaled_for_ga``: ``False`` makes ``training_step`` divide,
  ``None`` (the default) keeps the rule above.

So from 4.46 on, a ``compute_loss`` override that returns a per-micro-batch mean and never
uses ``num_items_in_batch`` gets no division by the accumulation count when the model is a
causal LM: the accumulated gradients are N times too large (learned from leads5 distillKitPlus,
issue #5, fixed by dividing in ``compute_loss``). TRL's preference trainers (DPO, KTO, CPO,
BCO, GRPO, ...) set ``model_accepts_loss_kwargs = False`` (TRL 0.15) or
``loss_is_scaled_for_ga`` (TRL 1.x) themselves; ``SFTTrainer`` sets neither.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import libcst as cst

from gradient_doctor.probes.static.base import RawFinding
from gradient_doctor.probes.static.frameworks import _bases
from gradient_doctor.probes.static.model import FileModel, FuncInfo
from gradient_doctor.probes.static.names import code_of, dotted_name
from gradient_doctor.probes.static.provenance import ACCUMULATION_WORDS, value_scaling
from gradient_doctor.probes.static.traverse import walk

__all__ = ["TRAINER_MEAN_MESSAGE", "trainer_mean_losses"]

TRAINER_MEAN_MESSAGE = (
    "`{cls}.compute_loss` returns `{loss}` (line {line}), a mean over one micro-batch, and "
    "never uses `num_items_in_batch`: {when}, so with `gradient_accumulation_steps` N > 1 the "
    "accumulated gradients are N times too large; divide it by "
    "`self.args.gradient_accumulation_steps` while training, or normalise it by "
    "`num_items_in_batch`"
)
WHEN_KWARGS = (
    "{version}the Trainer does not divide what `compute_loss` returns by the accumulation "
    "count when the model accepts loss kwargs (any causal LM of the library: its `forward` "
    "takes `**kwargs`), expecting the loss to be normalised by `num_items_in_batch`"
)
WHEN_NEVER = (
    "transformers {pin} (4.46.0 to 4.47.x) divides the loss by the accumulation count for no "
    "model at all"
)
UNKNOWN_VERSION = "with transformers 4.46 or later (the version is not pinned here), "
PINNED_VERSION = "with transformers {pin}, "

PLAIN_TRAINERS = frozenset({"Trainer", "Seq2SeqTrainer", "SFTTrainer"})
"""Trainers that leave ``model_accepts_loss_kwargs`` as the model says (TRL's preference
trainers turn it off themselves, so their Trainer divides)."""
CAUSAL_BASES = frozenset({"SFTTrainer"})
"""Trainers made for causal LMs, whose forward takes loss kwargs."""
CAUSAL_WORDS = re.compile(r"ForCausalLM|ForConditionalGeneration|ForSeq2SeqLM|CausalLM")
OPT_OUTS = ("model_accepts_loss_kwargs", "loss_is_scaled_for_ga", "compute_loss_func")
"""Settings that decide the Trainer's division: a subclass that sets them has thought of it."""
FIRST_AFFECTED = (4, 46)
FIRST_CONDITIONAL = (4, 48)

PIN = re.compile(
    r"""(?im)^[\s"'\-]*transformers\s*(?:\[[^\]]*\])?\s*(==|~=|>=|>|<=|<)\s*v?(\d+(?:\.\d+)*)"""
)
PIN_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "environment.yml", "environment.yaml")
MAX_LEVELS = 4


def trainer_mean_losses(model: FileModel) -> Iterator[RawFinding]:
    """Findings for the ``compute_loss`` overrides of the file's Trainer subclasses."""
    for class_name in model.class_nodes:
        finding = _check_class(model, class_name)
        if finding is not None:
            yield finding


def _check_class(model: FileModel, class_name: str) -> RawFinding | None:
    bases = _framework_bases(model, class_name)
    if not bases or not all(b in PLAIN_TRAINERS for b in bases):
        return None
    func = model.methods.get((class_name, "compute_loss"))
    if func is None or "num_items_in_batch" not in func.params:
        return None  # before 4.46 the Trainer passes no window count and divides itself
    if model.method_of(class_name, "training_step") is not None:
        return None  # the subclass (or a parent of ours) runs the backward itself
    if _mentions(func.node, "num_items_in_batch", skip_params=True):
        return None  # the count is used (normalised by it, or handed to the model)
    node = model.class_nodes[class_name]
    if ACCUMULATION_WORDS.search(code_of(node)):
        return None  # the class divides by the accumulation count somewhere
    if any(_sets(model, word) for word in OPT_OUTS):
        return None
    pin = transformers_pin(model.path)
    affected = _affected(pin)
    if affected is False:
        return None
    loss, anchor = _returned_loss(func)
    if loss is None or anchor is None:
        return None
    if value_scaling(model, func, loss, None).verdict == "accumulation":
        return None
    causal = bool(bases & CAUSAL_BASES) or bool(CAUSAL_WORDS.search(code_of(model.module)))
    version = pin[1] if pin is not None and pin[0] == "==" else None
    if version is not None and _version(version) < FIRST_CONDITIONAL:
        when = WHEN_NEVER.format(pin=version)
        severity = "warning"
    else:
        prefix = PINNED_VERSION.format(pin=version) if version else UNKNOWN_VERSION
        when = WHEN_KWARGS.format(version=prefix)
        severity = "warning" if causal else "info"
    evidence: dict[str, object] = {
        "cls": class_name,
        "loss": code_of(loss),
        "line": anchor,
        "when": when,
    }
    if severity == "info":
        evidence["uncertain"] = (
            "whether the model's forward accepts loss kwargs (then the Trainer skips its "
            "division) is not visible here"
        )
    return RawFinding(
        node=anchor,
        message=TRAINER_MEAN_MESSAGE,
        evidence=evidence,
        severity=severity,  # type: ignore[arg-type]
        fix_description=(
            "Divide the loss by `self.args.gradient_accumulation_steps` in `compute_loss` "
            "while training, or normalise it by `num_items_in_batch`, or set "
            "`model_accepts_loss_kwargs = False` (transformers 4.48+) / "
            "`loss_is_scaled_for_ga = False` (5.19+) so the Trainer divides."
        ),
    )


def _framework_bases(model: FileModel, class_name: str) -> set[str]:
    """The last names of the class's transformers / TRL bases that are trainers."""
    out: set[str] = set()
    for base in _bases(model, class_name):
        head, _, _ = base.partition(".")
        tail = base.rsplit(".", 1)[-1]
        if head in {"transformers", "trl"} and tail.endswith("Trainer"):
            out.add(tail)
    return out


def _mentions(node: cst.CSTNode, name: str, *, skip_params: bool) -> bool:
    """``name`` is read in ``node`` (its own parameter list left out)."""
    body = node.body if skip_params and isinstance(node, cst.FunctionDef) else node
    return any(isinstance(inner, cst.Name) and inner.value == name for inner in walk(body))


def _sets(model: FileModel, attribute: str) -> bool:
    """The file assigns ``attribute`` (``self.model_accepts_loss_kwargs = False``, a class
    attribute, or ``compute_loss_func=`` handed to a constructor)."""
    for inner in walk(model.module):
        if isinstance(inner, cst.Assign):
            for target in inner.targets:
                text = dotted_name(target.target) or ""
                if text.rsplit(".", 1)[-1] == attribute:
                    return True
        elif isinstance(inner, cst.AnnAssign):
            text = dotted_name(inner.target) or ""
            if text.rsplit(".", 1)[-1] == attribute:
                return True
        elif (
            isinstance(inner, cst.Arg)
            and inner.keyword is not None
            and inner.keyword.value == attribute
        ):
            return True
    return False


def _returned_loss(func: FuncInfo) -> tuple[cst.BaseExpression | None, cst.CSTNode | None]:
    """The loss ``compute_loss`` returns (the first of ``(loss, outputs)``) and where it is
    made: its one assignment in the function, else (assigned on several paths, or not a
    name) the last return. None when the returns disagree on the name."""
    losses: list[cst.BaseExpression] = []
    for value in func.returns:
        if isinstance(value, cst.IfExp):
            losses += [_first(value.body), _first(value.orelse)]
        else:
            losses.append(_first(value))
    texts = {code_of(v) for v in losses}
    if len(texts) != 1:
        return None, None
    loss = losses[0]
    if isinstance(loss, cst.Name):
        sites = func.assign_sites.get(loss.value, [])
        if len(sites) == 1 and isinstance(sites[0], cst.Assign):
            return loss, sites[0]
    return loss, losses[-1]


def _first(value: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(value, cst.Tuple) and value.elements:
        return value.elements[0].value
    return value


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


def _affected(pin: tuple[str, str] | None) -> bool | None:
    """False when every version the pin allows predates ``num_items_in_batch`` (the Trainer
    then divides); True when every one is 4.46 or later; None when unknown or mixed."""
    if pin is None:
        return None
    op, text = pin
    version = _version(text)
    if op in {"==", "~=", ">=", ">"}:
        if version >= FIRST_AFFECTED:
            return True
        return False if op == "==" else None
    if op == "<" and version <= FIRST_AFFECTED:
        return False
    if op == "<=" and version < FIRST_AFFECTED:
        return False
    return None


def transformers_pin(path: str | None) -> tuple[str, str] | None:
    """(operator, version) of the transformers requirement of the project that holds
    ``path``: the nearest ``requirements*.txt`` / ``pyproject.toml`` / ``setup.py`` ... in its
    folder or up to four folders above (stopping at a ``.git`` folder)."""
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        return None
    folder = file.resolve().parent
    for _ in range(MAX_LEVELS + 1):
        pin = _folder_pin(str(folder))
        if pin is not None:
            return pin
        if (folder / ".git").exists() or folder.parent == folder:
            return None
        folder = folder.parent
    return None


@lru_cache(maxsize=256)
def _folder_pin(folder: str) -> tuple[str, str] | None:
    here = Path(folder)
    try:
        names = sorted(
            p.name
            for p in here.iterdir()
            if p.is_file() and (p.name.startswith("requirements") or p.name in PIN_FILES)
        )
    except OSError:
        return None
    for name in names:
        try:
            text = (here / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = PIN.search(text[:200_000])
        if match is not None:
            return match.group(1), match.group(2)
    return None
