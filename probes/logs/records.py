"""From one log record (a dict of key → value) to step fields, and from records to steps.

:func:`map_record` turns ``{"train/loss": "2.3", "grad_norm": 0.5, "lr-AdamW": 1e-3}`` into
``{"loss": 2.3, "grad_norm": 0.5, "lr": 0.001}`` (values may be numbers, numeric strings such as
HF Trainer's ``'0.6793'`` or ``'nan'``, or booleans). :class:`StepAssembler` merges records that
share a step number (TensorBoard writes one scalar per event, Lightning's CSV one row per logging
call), numbers records that carry no step by their order, and feeds whole steps to a
:class:`~probes.logs.keeper.Keeper`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from gradient_doctor.probes.logs.fields import field_for, layer_for
from gradient_doctor.probes.logs.keeper import BULK_FIELDS, Keeper

#: Fields holding a yes/no value.
BOOL_FIELDS = frozenset({"skipped", "clipped"})
_NONFINITE = {
    "nan": math.nan,
    "-nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-inf": -math.inf,
    "-infinity": -math.inf,
}
_TRUE = frozenset({"true", "yes", "1", "1.0"})
_FALSE = frozenset({"false", "no", "0", "0.0"})

_key_cache: dict[str, tuple[str | None, str | None]] = {}


def number(value: Any) -> float | None:
    """``value`` as a float (numbers, numeric strings, ``'nan'``/``'inf'``), else None."""
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return None
    if isinstance(value, int | float):
        return float(value)
    if kind is str:
        text = value.strip()
        if text.startswith("tensor(") and text.endswith(")"):
            text = text[7:-1].split(",")[0].strip()
        try:
            return float(text)
        except ValueError:
            return _NONFINITE.get(text.lower())
    return None


def flag(value: Any) -> bool | None:
    """``value`` as a boolean (``True``, ``1``, ``'true'``), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def classify(key: str) -> tuple[str | None, str | None]:
    """(field, layer) for ``key``: at most one of them is set (cached: logs repeat keys)."""
    known = _key_cache.get(key)
    if known is None:
        field = field_for(key)
        known = (field, None if field is not None else layer_for(key))
        if len(_key_cache) < 100_000:
            _key_cache[key] = known
    return known


def map_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The step fields ``record`` holds (``step`` included when it has one)."""
    out: dict[str, Any] = {}
    layers: dict[str, float] = {}
    for key, raw in record.items():
        field, layer = classify(key)
        if field is not None:
            if field in out:
                continue  # the first spelling wins (``loss`` before ``train_loss``)
            if field in BOOL_FIELDS:
                value: Any = flag(raw)
            else:
                value = number(raw)
            if value is None:
                continue
            if field == "step":
                if not math.isfinite(value) or value != int(value) or value < 0:
                    continue
                value = int(value)
            out[field] = value
        elif layer is not None:
            value = number(raw)
            if value is not None:
                layers[layer] = value
    if layers:
        out["layer_grad_norms"] = layers
    return out


#: Fields that make a record a training step (a record with only a step or an lr is not).
TRAINING_FIELDS = frozenset(
    {"loss", "grad_norm", "grad_norm_before_clip", "scale", "skipped", "layer_grad_norms"}
)


class StepAssembler:
    """Merges records into steps in order and hands each finished step to ``keeper``."""

    def __init__(self, keeper: Keeper, *, max_norm: float | None = None) -> None:
        self.keeper = keeper
        self.max_norm = max_norm
        """The norm the run clipped at, when the caller knows it (``--max-norm``)."""
        self.records = 0
        """Records that held a training value."""
        self.numbered = 0
        """Records whose step number came from the log."""
        self.unapplied_norms = 0
        """Skipped (GradScaler overflow) steps whose non-finite norm was left out."""
        self.went_back = 0
        """Records whose step number was below the last one (a resumed run, a second run)."""
        self._pending: dict[str, Any] | None = None
        self._ready: dict[str, Any] | None = None
        """The last whole step, held back one step to compare its scale with the next one."""
        self._previous_scale: float | None = None
        self._last_step: int | None = None
        self._ordinal = 0
        self._lr: float | None = None

    def add(self, fields: dict[str, Any]) -> None:
        """One record's fields (as :func:`map_record` returns them)."""
        if "lr" in fields and not TRAINING_FIELDS.intersection(fields):
            # a learning-rate-only record (Lightning's LearningRateMonitor row): it applies to
            # the step it names, or to the next training record
            self._lr = fields["lr"]
            step = fields.get("step")
            if self._pending is not None and step is not None and step == self._pending["step"]:
                self._pending.setdefault("lr", fields["lr"])
            return
        if not TRAINING_FIELDS.intersection(fields):
            return
        self.records += 1
        step = fields.get("step")
        if step is None:
            self._ordinal += 1
            step = self._ordinal
        else:
            self.numbered += 1
            self._ordinal = step
        if self._pending is not None and step == self._pending["step"]:
            for name, value in fields.items():
                if name == "layer_grad_norms":
                    self._pending.setdefault(name, {}).update(value)
                else:
                    self._pending.setdefault(name, value)
            return
        latest = self._pending["step"] if self._pending is not None else self._last_step
        if latest is not None and step < latest:
            self.went_back += 1
            return
        self._flush()
        self._pending = {**fields, "step": step}
        if "lr" not in self._pending and self._lr is not None:
            self._pending["lr"] = self._lr

    def add_columns(self, steps: list[int] | None, values: dict[str, list[float]]) -> None:
        """Many records with the same numeric fields (``probes.logs.fastpath.Columns``): taken
        in bulk when nothing needs merging, numbering or deriving, else one by one."""
        count = len(next(iter(values.values())))
        bulk = (
            count > 0
            and self.max_norm is None
            and BULK_FIELDS.issuperset(values)
            and bool(TRAINING_FIELDS.intersection(values))
        )
        if bulk and steps is not None:
            latest = self._pending["step"] if self._pending is not None else self._last_step
            bulk = (latest is None or steps[0] > latest) and all(
                a < b for a, b in itertools.pairwise(steps)
            )
        if not bulk:
            for row in range(count):
                record: dict[str, Any] = {name: column[row] for name, column in values.items()}
                if steps is not None:
                    record["step"] = steps[row]
                self.add(record)
            return
        self._flush()
        self._hand_over(None)
        if steps is None:
            steps = list(range(self._ordinal + 1, self._ordinal + count + 1))
        else:
            self.numbered += count
        self._ordinal = steps[-1]
        self.records += count
        if "lr" not in values and self._lr is not None:
            values = {**values, "lr": [self._lr] * count}
        # The last record stays pending, as one by one: a record of another shape with the
        # same step number may follow and merge into it.
        if count > 1:
            self._last_step = steps[-2]
            self.keeper.add_columns(
                steps[:-1], {name: column[:-1] for name, column in values.items()}
            )
        self._pending = {name: column[-1] for name, column in values.items()}
        self._pending["step"] = steps[-1]

    def _flush(self) -> None:
        if self._pending is None:
            return
        self._last_step = self._pending["step"]
        step = _with_clipping(self._pending, self.max_norm)
        self._pending = None
        self._hand_over(step.get("scale"))
        self._ready = step

    def _hand_over(self, next_scale: float | None) -> None:
        """Give the held step to the keeper, with ``skipped`` derived from the scale when the
        log does not say: GradScaler lowers its scale only after an overflow, so a step whose
        norm is not finite (or not logged) next to a fall of the scale is a skipped step."""
        ready = self._ready
        if ready is None:
            return
        scale = ready.get("scale")
        if scale is not None and "skipped" not in ready:
            norm = ready.get("grad_norm_before_clip", ready.get("grad_norm"))
            fell_here = self._previous_scale is not None and scale < self._previous_scale
            falls_next = next_scale is not None and next_scale < scale
            if norm is None:
                ready["skipped"] = fell_here
            elif not math.isfinite(norm):
                ready["skipped"] = fell_here or falls_next
        if scale is not None:
            self._previous_scale = scale
        if ready.get("skipped"):
            # no update was applied: the overflowed norm is not a gradient the run used
            for name in ("grad_norm", "grad_norm_before_clip"):
                value = ready.get(name)
                if value is not None and not math.isfinite(value):
                    del ready[name]
                    self.unapplied_norms += name == "grad_norm"
            for name in ("layer_grad_norms", "param_grad_norms"):
                values = ready.get(name)
                numbers = values.values() if isinstance(values, dict) else values or []
                if any(v is not None and not math.isfinite(v) for v in numbers):
                    del ready[name]
        self.keeper.add(ready)
        self._ready = None

    def finish(self) -> None:
        """Hand over the last steps."""
        self._flush()
        self._hand_over(None)


def _with_clipping(fields: dict[str, Any], max_norm: float | None) -> dict[str, Any]:
    """With a known clip threshold, a logged total norm is the one clipping saw (what
    ``clip_grad_norm_`` returns, and what the HF Trainer and Lightning log): derive the clip
    fields from it, unless the log already gave them."""
    limit = fields.get("clip_max_norm", max_norm)
    norm = fields.get("grad_norm")
    if (
        limit is None
        or not math.isfinite(limit)
        or limit <= 0
        or norm is None
        or "grad_norm_before_clip" in fields
        or "clipped" in fields
    ):
        return fields
    fields["grad_norm_before_clip"] = norm
    fields["clip_max_norm"] = limit
    if math.isfinite(norm):
        fields["clipped"] = norm > limit
        fields["grad_norm"] = min(norm, limit)
    return fields
