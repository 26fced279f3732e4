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

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Fields :meth:`Keeper.add_columns` takes in bulk (the others need the step-by-step path).
BULK_FIELDS = frozenset({"loss", "grad_norm", "lr"})

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
        self._recent: deque[Any] = deque()
        """The last steps: :class:`_Point`, or ``(index, steps, columns, row)`` for a step
        taken in bulk (made a point only if it is kept)."""
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
        recent = self._recent
        for position in range(max(0, len(recent) - SPIKE_WINDOW), len(recent)):
            earlier = recent[position]
            if not isinstance(earlier, _Point):
                earlier = recent[position] = _materialise(earlier)
            earlier.keep = True
        self._keep_next = max(self._keep_next, AFTER)

    # -- bulk ----------------------------------------------------------------------------------
    def add_columns(self, steps: list[int], values: dict[str, list[float]]) -> None:
        """Many steps at once, exactly as :meth:`add` one by one would take them.

        ``steps`` must increase; ``values`` holds columns of :data:`BULK_FIELDS` only, every
        row set. The rows near an anomaly (and the head, and the last rows) go through
        :meth:`add`; the others, where nothing happens but counting, the spike trackers'
        history and the sampling, are taken without building a dict per step. Which rows are
        anomalies is decided ahead with the trackers' own rule on the whole column (numpy).
        """
        import numpy as np

        count = len(steps)
        if count == 0:
            return
        names = list(values)
        loss = values.get("loss")
        norm = values.get("grad_norm")
        slow = np.zeros(count, dtype=bool)
        slow[: max(0, self.head_size - len(self._head))] = True
        slow[: self._keep_next] = True
        slow[max(0, count - max(self.tail_size, SPIKE_WINDOW + 1)) :] = True
        bad = np.zeros(count, dtype=bool)
        for column in (loss, norm):
            if column is not None:
                bad |= ~np.isfinite(np.asarray(column, dtype=float))
        active = count
        if self.stats.first_nonfinite_step is None:
            first_bad = int(np.argmax(bad)) if bad.any() else count
            active = first_bad
            events: list[int] = [first_bad] if first_bad < count else []
            for column, tracker in ((norm, self._norms), (loss, self._losses)):
                if column is None:
                    continue
                if tracker.pending is not None:
                    slow[0] = True
                events.extend(_high_rows(tracker, column[:first_bad]))
            for event in events:
                slow[max(0, event - SPIKE_WINDOW) : event + AFTER + 2] = True
        edges = np.flatnonzero(np.diff(slow.astype(np.int8))) + 1
        bounds = [0, *edges.tolist(), count]
        stats = self.stats
        for start, end in itertools.pairwise(bounds):
            if slow[start]:
                for row in range(start, end):
                    record: dict[str, Any] = {name: values[name][row] for name in names}
                    record["step"] = steps[row]
                    self.add(record)
                continue
            # Bulk rows: counted, pushed to the trackers, passed through the tail window.
            if stats.first_step is None:
                stats.first_step = steps[start]
            stats.last_step = steps[end - 1]
            if not stats.fields.issuperset(names):
                stats.fields.update(names)
                stats.fields.add("step")
            pushed_end = min(end, active) if stats.first_nonfinite_step is None else start
            if pushed_end > start:
                for column, tracker in ((norm, self._norms), (loss, self._losses)):
                    if column is not None:
                        tracker.history.extend(column[start:pushed_end])
                        tracker.seen += pushed_end - start
                        tracker.pending = None
            stats.nonfinite_steps += int(bad[start:end].sum())
            recent = self._recent
            tail = self.tail_size
            index = stats.steps
            for row in range(start, end):
                recent.append((index, steps, values, row))
                index += 1
                if len(recent) > tail:
                    self._retire(recent.popleft())
            stats.steps = index

    def _retire(self, point: _Point | tuple[int, list[int], dict[str, list[float]], int]) -> None:
        """A step leaves the tail window: keep it as an anomaly, a sample, or drop it."""
        if not isinstance(point, _Point):
            if point[0] % self._stride:
                return
            point = _materialise(point)
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
        recent = [p if isinstance(p, _Point) else _materialise(p) for p in self._recent]
        kept = self._head + self._anomalous + self._middle + recent
        kept.sort(key=lambda p: p.index)
        return [p.values for p in kept]

    @property
    def thinned(self) -> bool:
        """True when some steps were dropped from the kept series."""
        return self._stride > 1


def _materialise(lazy: tuple[int, list[int], dict[str, list[float]], int]) -> _Point:
    """The point of a step taken in bulk."""
    index, steps, columns, row = lazy
    values: dict[str, Any] = {name: column[row] for name, column in columns.items()}
    values["step"] = steps[row]
    return _Point(values, index)


def _high_rows(tracker: _SpikeTracker, column: list[float]) -> list[int]:
    """Rows of ``column`` (all finite, pushed in order after the tracker's history) whose value
    the tracker will find above factor × the running median: the same test, on all rows at
    once."""
    import numpy as np

    history = list(tracker.history)
    rows: list[int] = []
    factor = tracker.factor
    # the first rows, while the window is not full yet: one by one, as the tracker does
    window = list(history)
    seen = tracker.seen
    first_full = 0
    for row, value in enumerate(column):
        if len(window) >= SPIKE_WINDOW:
            first_full = row
            break
        if seen >= SPIKE_WARMUP:
            ordered = sorted(window)
            size = len(ordered)
            middle = size // 2
            median = ordered[middle] if size % 2 else (ordered[middle - 1] + ordered[middle]) / 2
            if median > 0 and value > factor * median:
                rows.append(row)
        window.append(value)
        seen += 1
    else:
        return rows
    extended = np.asarray(history[-SPIKE_WINDOW:] + list(column), dtype=float)
    offset = min(len(history), SPIKE_WINDOW)
    windows = np.lib.stride_tricks.sliding_window_view(extended, SPIKE_WINDOW)
    # row r's window ends just before it: extended[offset + r - 10 : offset + r]
    medians = np.median(
        windows[offset + first_full - SPIKE_WINDOW : offset + len(column) - SPIKE_WINDOW], axis=1
    )
    values = extended[offset + first_full :]
    high = (medians > 0) & (values > factor * medians)
    rows.extend((np.flatnonzero(high) + first_full).tolist())
    return rows
