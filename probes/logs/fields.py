"""Which log column or key means which step-series field (tolerant name mapping).

Trainers spell the same quantity many ways: ``loss``, ``train/loss``, ``train_loss_step``;
``grad_norm``, ``total_norm``, ``gnorm``, Lightning's ``grad_2.0_norm_total``; ``lr``,
``learning_rate``, Lightning's ``lr-AdamW``; ``scale``, ``loss_scale``. :func:`field_for` maps a
key onto a :class:`~probes.runtime.signals.series.StepPoint` field name (or ``"step"``), and
:func:`layer_for` recognises per-layer gradient-norm keys (``grad_norm/fc1.weight``).

Evaluation and epoch-level aggregates (``eval_loss``, ``val/loss``, ``train_loss_epoch``) are
deliberately not mapped: they are not per-step training values, and mixing them into the step
series would invent spikes.
"""

from __future__ import annotations

import re

#: Normalised key → field. Keys are normalised by :func:`normalise` first.
_NAMES: dict[str, tuple[str, ...]] = {
    "step": ("step", "global_step", "iter", "iteration", "it", "_step", "steps", "update"),
    "loss": ("loss", "loss_step", "training_loss", "train_loss", "total_loss", "lm_loss"),
    "grad_norm": (
        "grad_norm",
        "gradient_norm",
        "grad_norm_total",
        "total_grad_norm",
        "total_norm",
        "gnorm",
        "grad_l2_norm",
        "grad_2_0_norm_total",
        "grad_norm_after_clip",
        "clipped_grad_norm",
    ),
    "grad_norm_before_clip": (
        "grad_norm_before_clip",
        "grad_norm_unclipped",
        "unclipped_grad_norm",
        "pre_clip_grad_norm",
        "grad_norm_pre_clip",
    ),
    "lr": ("lr", "learning_rate", "lr_0", "lr_group_0", "lr_pg0", "learningrate"),
    "scale": ("scale", "loss_scale", "grad_scale", "scaler_scale", "amp_scale", "lossscale"),
    "skipped": ("skipped", "step_skipped", "overflow", "skipped_step"),
    "clipped": ("clipped", "grad_clipped"),
    "clip_max_norm": ("max_grad_norm", "clip_max_norm", "grad_clip", "max_norm", "clip_grad"),
}
KEY_FIELDS: dict[str, str] = {name: field for field, names in _NAMES.items() for name in names}

#: Prefixes that only say "this is a training value"; stripped before the lookup.
_TRAIN_PREFIXES = ("train/", "training/", "trainer/", "optim/", "optimizer/", "opt/", "train_")
#: A key naming an evaluation or an aggregate over an epoch, never a training step.
_NOT_A_STEP = re.compile(
    r"(^|[/_\- ])(val|valid|validation|eval|evaluation|test)([/_\- ]|$)|epoch$"
)
#: Lightning's LearningRateMonitor: ``lr-AdamW``, ``lr-SGD/pg1``, ``lr-Adam-momentum`` (not lr).
_LR_MONITOR = re.compile(r"^lr-[A-Za-z0-9_]+(/pg0)?$")
#: Per-layer gradient norms: ``grad_norm/<name>``, Lightning's ``grad_2.0_norm/<name>``,
#: ``grad_norms/<name>``, ``gradients/<name>_norm``.
_LAYER_KEY = re.compile(
    r"^(?:train/)?(?:grad_norm|grad_norms|grad_2\.0_norm|gradient_norm|grad/norm|grad)[/.](.+)$"
)


def normalise(key: str) -> str:
    """Lower case, training prefixes stripped, separators as ``_``."""
    name = key.strip().lower()
    for prefix in _TRAIN_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix) :]
            break
    return re.sub(r"[\s\-./]+", "_", name)


def is_evaluation(key: str) -> bool:
    """True for evaluation and per-epoch keys (``eval_loss``, ``val/loss``, ``loss_epoch``)."""
    return bool(_NOT_A_STEP.search(key.strip().lower()))


def field_for(key: str) -> str | None:
    """The StepPoint field (or ``"step"``) ``key`` names, or None when it names none."""
    if is_evaluation(key):
        return None
    if _LR_MONITOR.match(key.strip()):
        return "lr"
    found = KEY_FIELDS.get(normalise(key))
    if found is None and "/" in key:
        # a namespace of the logger's own (``amp/loss_scale``, ``optim/lr``): the last part
        found = KEY_FIELDS.get(normalise(key.rsplit("/", 1)[1]))
    return found


def layer_for(key: str) -> str | None:
    """The layer or parameter name of a per-layer gradient-norm key, else None."""
    match = _LAYER_KEY.match(key.strip())
    if match is None or is_evaluation(key):
        return None
    name = match.group(1)
    if normalise(name) in ("total", "norm", "total_norm"):
        return None  # Lightning's grad_2.0_norm_total written with a slash
    return name


def describe(fields: set[str] | frozenset[str]) -> list[str]:
    """The series found, in a stable reading order."""
    order = [
        "loss",
        "grad_norm",
        "grad_norm_before_clip",
        "lr",
        "scale",
        "skipped",
        "clipped",
        "clip_max_norm",
        "layer_grad_norms",
    ]
    known = [name for name in order if name in fields]
    return known + sorted(f for f in fields if f not in order and f != "step")
