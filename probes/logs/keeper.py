"""A bounded step series built from a stream: exact where it matters, thinned in between.

A long run's log can hold millions of steps; the diagnosis and the plots need a few thousand.
:class:`Keeper` receives the steps in order, one at a time, and keeps:

- the first ``head`` steps and the last ``tail`` steps exactly;
- every step around an anomaly, exactly: a gradient-norm or loss value above ``spike_factor`` ×
  the running median of the previous :data:`SPIKE_WINDOW` values (whether or not the next step
  comes back down), the first non-finite loss or norm, a GradScaler scale that fell, a skipped
  step. The :data:`SPIKE_WINDOW` steps before it and :data:`AFTER` steps after it are kept too,
  so the spike signal, which compares a step with the median of the previous ten *kept*
  steps, judges it on the same numbers as on the full log;
- in between, an evenly spaced sample: every ``stride``-th step, the stride doubling (and every
  other sample dropped) whenever the sample fills up.

Counts that need every step (steps read, non-finite steps, isolated spikes) are taken exactly
while streaming (:class:`StreamStats`), whatever is thinned out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Same window as the spike signal (``probes.runtime.signals.grad_norm_spikes``).
SPIKE_WINDOW = 10
#: The spike signal ignores the first steps (no running median yet).
SPIKE_WARMUP = 5
#: Steps kept after an anomaly (the spike signal looks one step ahead; the plots like a few).
AFTER = 3


@dataclass(slots=True)
class _Point:
    values: dict[str, Any]
    index: int
    keep: bool = False


@dataclass
class StreamStats:
    """Exact counts over every step read, whatever was thinned out."""

    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    first_nonfinite_step: int | None = None
    first_nonfinite_field: str | None = None
    nonfinite_steps: int = 0
    norm_spikes: int = 0
    """Isolated gradient-norm spikes (the spike signal's rule, on the raw norm)."""
    first_norm_spike_step: int | None = None
    loss_spikes: int = 0
    first_loss_spike_step: int | None = None
    scale_drops: int = 0
    skipped_steps: int = 0
    anomalies_kept: int = 0
    anomalies_dropped: int = 0
    """Anomaly windows not kept exactly because ``max_anomalies`` was reached."""
    fields: set[str] = field(default_factory=set)
    layers: list[str] = field(default_factory=list)


class _SpikeTracker:
    """The spike rule on one series, streaming: value > factor × median of the previous ten
    values (from the sixth on); isolated when the next value is not."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.history: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.seen = 0
        self.pending: float | None = None
        """Threshold of a candidate spike waiting for the next value, when there is one."""

    def push(self, value: float) -> tuple[bool, bool]:
        """Feed the next value: (it is above the running median × factor, the previous
        candidate turned out isolated)."""
        isolated = self.pending is not None and value <= self.pending
        self.pending = None
        high = False
        if self.seen >= SPIKE_WARMUP:
            ordered = sorted(self.history)
            size = len(ordered)
            middle = size // 2
            median = ordered[middle] if size % 2 else (ordered[middle - 1] + ordered[middle]) / 2
            if median > 0 and value > self.factor * median:
                high = True
                self.pending = self.factor * median
        self.history.append(value)
        self.seen += 1
        return high, isolated


def _finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a flag), else None."""
    if type(value) is float:
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class Keeper:
    """Receives steps in step order (:meth:`add`), returns the bounded series (:meth:`finish`)."""

    def __init__(
        self,
        *,
        spike_factor: float,
        head: int = 256,
        tail: int = 256,
        middle: int = 4096,
        max_anomalies: int = 256,
        layer_values: int = 400_000,
    ) -> None:
        self.head_size = head
        self.tail_size = max(tail, SPIKE_WINDOW + AFTER + 2)
        self.middle_size = middle
        self.max_anomalies = max_anomalies
        self.layer_values = layer_values
        self.stats = StreamStats()
        self._head: list[_Point] = []
        self._recent: deque[_Point] = deque()
        self._middle: list[_Point] = []
        self._anomalous: list[_Point] = []
        self._stride = 1
        self._keep_next = 0
        self._norms = _SpikeTracker(spike_factor)
        self._losses = _SpikeTracker(spike_factor)
        self._last_norm_point: _Point | None = None
        self._last_loss_point: _Point | None = None
        self._last_scale: float | None = None
        self._layer_names: dict[str, None] = {}

    # -- streaming -----------------------------------------------------------------------------
    def add(self, values: dict[str, Any]) -> None:
        """One step: a dict of StepPoint fields with ``step`` set (steps must increase)."""
        stats = self.stats
        point = _Point(values, stats.steps)
        step = values["step"]
        stats.steps += 1
        if stats.first_step is None:
            stats.first_step = step
        stats.last_step = step
        if values.keys() - stats.fields:
            stats.fields.update(name for name, value in values.items() if value is not None)
        layers = values.get("layer_grad_norms")
        if layers:
            for name in layers:
                if name not in self._layer_names:
                    self._layer_names[name] = None
                    self._shrink_for_layers()
        if self._keep_next > 0:
            point.keep = True
            self._keep_next -= 1
        self._watch(point)
        if len(self._head) < self.head_size:
            self._head.append(point)
            return
        self._recent.append(point)
        if len(self._recent) > self.tail_size:
            self._retire(self._recent.popleft())

    def _watch(self, point: _Point) -> None:
        values = point.values
        stats = self.stats
        step = values["step"]
        loss = _finite_number(values.get("loss"))
        norm = _finite_number(values.get("grad_norm_before_clip"))
        if norm is None:
            norm = _finite_number(values.get("grad_norm"))
        skipped = values.get("skipped") is True
        applied = _finite_number(values.get("grad_norm"))
        if applied is None:
            applied = norm
        bad_field = None
        if loss is not None and not math.isfinite(loss):
            bad_field = "loss"
        elif applied is not None and not math.isfinite(applied) and not skipped:
            bad_field = "grad_norm"
        if bad_field is not None:
            stats.nonfinite_steps += 1
            if stats.first_nonfinite_step is None:
                stats.first_nonfinite_step = step
                stats.first_nonfinite_field = bad_field
                self._anomaly(point)
        if skipped:
            stats.skipped_steps += 1
            self._anomaly(point)
        scale = _finite_number(values.get("scale"))
        if scale is not None:
            if self._last_scale is not None and scale < self._last_scale:
                stats.scale_drops += 1
                self._anomaly(point)
            self._last_scale = scale
        if norm is not None and math.isfinite(norm) and stats.first_nonfinite_step is None:
            high, isolated = self._norms.push(norm)
            if isolated and self._last_norm_point is not None:
                stats.norm_spikes += 1
                if stats.first_norm_spike_step is None:
                    stats.first_norm_spike_step = self._last_norm_point.values["step"]
            if high:
                self._anomaly(point)
            self._last_norm_point = point
        if loss is not None and math.isfinite(loss) and stats.first_nonfinite_step is None:
            high, isolated = self._losses.push(loss)
            if isolated and self._last_loss_point is not None:
                stats.loss_spikes += 1
                if stats.first_loss_spike_step is None:
                    stats.first_loss_spike_step = self._last_loss_point.values["step"]
            if high:
                self._anomaly(point)
            self._last_loss_point = point

    def _anomaly(self, point: _Point) -> None:
        """Keep ``point``, the SPIKE_WINDOW steps before it and AFTER steps after it."""
        if point.keep and self._keep_next:
            self._keep_next = max(self._keep_next, AFTER)
            return
        if self.stats.anomalies_kept >= self.max_anomalies:
            self.stats.anomalies_dropped += 1
            return
        self.stats.anomalies_kept += 1
        point.keep = True
        # the point itself is not in ``_recent`` yet; the window before it is its tail
        for earlier in list(self._recent)[-SPIKE_WINDOW:]:
            earlier.keep = True
        self._keep_next = max(self._keep_next, AFTER)

    def _retire(self, point: _Point) -> None:
        """A step leaves the tail window: keep it as an anomaly, a sample, or drop it."""
        if point.keep:
            self._anomalous.append(point)
            return
        if point.index % self._stride:
            return
        self._middle.append(point)
        if len(self._middle) > self.middle_size:
            self._stride *= 2
            self._middle = [p for p in self._middle if p.index % self._stride == 0]

    def _shrink_for_layers(self) -> None:
        """Per-layer values multiply the memory of each kept step: fewer samples when many."""
        per_step = 1 + len(self._layer_names)
        self.middle_size = max(256, min(self.middle_size, self.layer_values // per_step))

    # -- result --------------------------------------------------------------------------------
    @property
    def stride(self) -> int:
        """Spacing of the sample between the head and the tail (1: every step was kept)."""
        return self._stride

    def finish(self) -> list[dict[str, Any]]:
        """The kept steps, in step order."""
        self.stats.layers = list(self._layer_names)
        kept = self._head + self._anomalous + self._middle + list(self._recent)
        kept.sort(key=lambda p: p.index)
        return [p.values for p in kept]

    @property
    def thinned(self) -> bool:
        """True when some steps were dropped from the kept series."""
        return self._stride > 1
