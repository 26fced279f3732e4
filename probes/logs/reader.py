"""Read one training log into a bounded :class:`~probes.runtime.signals.series.RunSeries`.

:func:`read_log` detects the format (``probes.logs.detect``), streams the records through a
:class:`~probes.logs.records.StepAssembler` into a :class:`~probes.logs.keeper.Keeper` (bounded
memory, exact anomalies), and returns a :class:`LogRun`: the series the signals judge plus what
the reading met (exact counts, notes on what the log could not say).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.detect import detect
from gradient_doctor.probes.logs.fastpath import Columns, blocks
from gradient_doctor.probes.logs.formats.base import LogFormat, LogReadError, ReadStats
from gradient_doctor.probes.logs.keeper import Keeper, StreamStats
from gradient_doctor.probes.logs.records import StepAssembler
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

#: Per-parameter names of a layer's weight and bias (``fc1.weight`` → layer ``fc1``).
_PARAM_SUFFIX = re.compile(r"^(.*)[./](weight|bias)$")
#: Layers whose gradient norms are not comparable with the others' (normalisation scales,
#: embeddings: the probe leaves them out of the per-layer judgements too).
_NOT_A_WEIGHT_LAYER = re.compile(
    r"(^|[._/])(ln\w*|\w*norm\w*|bn\d*|embed\w*|emb|wte|wpe|tok_embeddings)([._/]|$)",
    re.IGNORECASE,
)


@dataclass
class LogRun:
    """A log read into a series, with the facts of the reading."""

    path: Path
    format: LogFormat
    series: RunSeries
    stats: StreamStats
    read: ReadStats
    read_s: float
    stride: int
    records: int
    numbered: int
    went_back: int
    notes: list[str] = field(default_factory=list)

    @property
    def thinned(self) -> bool:
        """True when steps between the head, the tail and the anomalies were sampled."""
        return self.stride > 1


def _group_parameters(points: list[dict[str, Any]]) -> list[str] | None:
    """When per-layer keys are parameter names (``fc1.weight``, ``fc1.bias``), fold them into
    layers (L2 over the layer's parameters) in place; the layers that own a ``.weight`` and do
    not look like normalisation or embedding layers are returned as the weight layers."""
    names: dict[str, None] = {}
    for point in points:
        for name in point.get("layer_grad_norms") or {}:
            names.setdefault(name, None)
    if not names or not all(_PARAM_SUFFIX.match(n) for n in names):
        return None
    weight_layers: list[str] = []
    for name in names:
        match = _PARAM_SUFFIX.match(name)
        assert match is not None
        layer, kind = match.group(1), match.group(2)
        if kind != "weight" or layer in weight_layers:
            continue
        if not _NOT_A_WEIGHT_LAYER.search(layer):
            weight_layers.append(layer)
    for point in points:
        norms = point.get("layer_grad_norms")
        if not norms:
            continue
        sums: dict[str, float] = {}
        for name, value in norms.items():
            match = _PARAM_SUFFIX.match(name)
            assert match is not None
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + value * value
        point["layer_grad_norms"] = {k: math.sqrt(v) for k, v in sums.items()}
    return weight_layers


def read_log(
    path: str | Path,
    *,
    spike_factor: float,
    log_format: str | None = None,
    max_norm: float | None = None,
    fast: bool = True,
    **limits: Any,
) -> LogRun:
    """Read ``path`` (a file, or a folder of TensorBoard event files) into a :class:`LogRun`.

    ``spike_factor`` is the active profile's, so the anomalies kept exactly are the ones the
    spike signal will look for. ``max_norm``: the threshold the run clipped at, when the log
    does not say (its logged norm is then read as the norm before clipping). ``fast`` reads
    line formats a block at a time (``probes.logs.fastpath``: the same records, faster); False
    reads them line by line. ``limits`` go to :class:`~probes.logs.keeper.Keeper`. Raises
    :class:`~probes.logs.formats.base.LogReadError` (one line) for anything unreadable.
    """
    started = time.perf_counter()
    source = Path(path).expanduser()
    try:
        target, fmt = detect(source, log_format)
    except KeyError as exc:
        raise LogReadError(str(exc.args[0])) from None
    keeper = Keeper(spike_factor=spike_factor, **limits)
    assembler = StepAssembler(keeper, max_norm=max_norm)
    read = ReadStats()
    parse = fmt.line_parser() if fast else None
    try:
        if parse is None:
            for fields in fmt.records(target, read):
                assembler.add(fields)
        else:
            for item in blocks(target, read, parse, json_values=fmt.json_values):
                if isinstance(item, Columns):
                    assembler.add_columns(item.steps, item.values)
                else:
                    assembler.add(item)
    except OSError as exc:
        raise LogReadError(f"{target}: cannot read it ({exc.strerror or exc})") from None
    assembler.finish()
    points = keeper.finish()
    stats = keeper.stats
    if not points:
        raise LogReadError(
            f"{target}: read as {fmt.title}, but no record held a training value "
            "(loss, gradient norm, GradScaler scale)"
        )
    notes: list[str] = []
    run_fields: dict[str, Any] = dict(read.run)
    if "layer_grad_norms" in stats.fields and "weight_layers" not in run_fields:
        weight_layers = _group_parameters(points)
        if weight_layers:
            run_fields["weight_layers"] = weight_layers
            notes.append(
                "per-layer norms were logged per parameter; they are folded into layers, and "
                "the weight layers are told apart from normalisation and embedding layers by "
                "their names"
            )
        else:
            notes.append(
                "per-layer norms are plotted but not compared: the log does not say which "
                "layers hold weight matrices"
            )
    if assembler.numbered == 0:
        notes.append(
            "the log has no step numbers; steps are counted in record order (one per logged "
            "record, which may stand for several optimizer steps)"
        )
    if assembler.unapplied_norms:
        notes.append(
            f"{assembler.unapplied_norms} step(s) skipped by the GradScaler logged a non-finite "
            "gradient norm; no update was applied on them, so those norms are left out"
        )
    if assembler.went_back:
        notes.append(
            f"{assembler.went_back} record(s) went back in step number (a resumed or second "
            "run in the same log?) and were left out"
        )
    if stats.anomalies_dropped:
        notes.append(
            f"{stats.anomalies_dropped} anomalies past the first {stats.anomalies_kept} were "
            "counted but not kept step by step"
        )
    series = RunSeries(
        source="log",
        steps=[StepPoint.model_validate(p) for p in points],
        **run_fields,
    )
    return LogRun(
        path=target,
        format=fmt,
        series=series,
        stats=stats,
        read=read,
        read_s=time.perf_counter() - started,
        stride=keeper.stride,
        records=assembler.records,
        numbered=assembler.numbered,
        went_back=assembler.went_back,
        notes=notes,
    )
