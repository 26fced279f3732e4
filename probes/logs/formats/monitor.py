"""Our own ``GradientMonitor`` JSONL (``GradientMonitor(..., log_path=...)`` and the callbacks in
``probes.integrations``): one :class:`~probes.runtime.result.StepRecord` per line.

Each line holds ``step``, ``total_norm`` and per-parameter ``grad_norms`` (aligned with the
model's parameters), plus, when known, the losses given to ``backward()``, the clip call's norm
and ``max_norm``, the learning rate, the GradScaler scale and skipped flag, and the order of
training calls. The callbacks write a header line first (:data:`HEADER_KIND`) naming the
parameters, their layers and shapes; with it the per-layer norms and the per-parameter signals
(zero gradients, layer spread) work as in the probe. Without it the per-parameter norms have no
names and only the total-norm series is judged.

Records are read field by field, not validated against ``StepRecord``: a log written by an older
or newer version still reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.formats.jsonl import json_objects
from gradient_doctor.probes.logs.records import flag, number

#: The ``gradient_doctor`` value of the header line the integrations write.
HEADER_KIND = "monitor-header"
#: Keys only a StepRecord line has.
SIGNATURE = frozenset({"grad_norms", "total_norm"})
#: StepRecord keys copied as they are (lists of strings, flags).
_PASSTHROUGH = ("events", "loss_ops", "nonfinite_params")


def header_record(summary: dict[str, Any]) -> dict[str, Any]:
    """The header line for a monitor's collector summary (parameters, layers, shapes)."""
    return {
        "gradient_doctor": HEADER_KIND,
        "parameters": list(summary.get("parameters", [])),
        "layers": list(summary.get("layers", [])),
        "shapes": [list(s) for s in summary.get("shapes", [])],
        "layer_types": dict(summary.get("layer_types", {})),
    }


def weight_layers(layers: list[str], shapes: list[list[int]], kinds: dict[str, str]) -> list[str]:
    """Layers with a 2-D+ parameter that are not embeddings (the probe's rule)."""
    seen: list[str] = []
    for layer, shape in zip(layers, shapes, strict=False):
        if len(shape) >= 2 and layer not in seen and not kinds.get(layer, "").startswith("Embed"):
            seen.append(layer)
    return seen


def _numbers(values: Any) -> list[float | None] | None:
    if not isinstance(values, list):
        return None
    return [number(v) for v in values]


def layer_norms(layers: list[str], norms: list[float | None]) -> dict[str, float]:
    """Per-layer L2 norm from per-parameter norms."""
    sums: dict[str, float] = {}
    for layer, norm in zip(layers, norms, strict=False):
        if norm is not None:
            sums[layer] = sums.get(layer, 0.0) + norm * norm
    return {layer: math.sqrt(total) for layer, total in sums.items()}


def step_fields(record: dict[str, Any], layers: list[str] | None) -> dict[str, Any]:
    """The StepPoint fields of one StepRecord line."""
    out: dict[str, Any] = {}
    step = record.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        out["step"] = step
    optimizer = record.get("optimizer")
    if isinstance(optimizer, int) and not isinstance(optimizer, bool):
        out["optimizer"] = optimizer
    losses = _numbers(record.get("losses"))
    if losses:
        out["losses"] = losses
        present = [v for v in losses if v is not None]
        if present:
            out["loss"] = sum(present) / len(present)
    for source, target in (
        ("total_norm", "grad_norm"),
        ("total_norm_before_clip", "grad_norm_before_clip"),
        ("clip_max_norm", "clip_max_norm"),
        ("clip_value", "clip_value"),
        ("lr", "lr"),
        ("scale", "scale"),
    ):
        value = number(record.get(source))
        if value is not None:
            out[target] = value
    for source in ("clipped", "skipped", "grad_reused"):
        value = flag(record.get(source))
        if value is not None:
            out[source] = value
    for source in _PASSTHROUGH:
        value = record.get(source)
        if value and isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[source] = value
    norms = _numbers(record.get("grad_norms"))
    if norms is not None:
        out["param_grad_norms"] = norms
        if layers and len(layers) == len(norms):
            out["layer_grad_norms"] = layer_norms(layers, norms)
    return out


class MonitorJsonl(LogFormat):
    id = "gradient-monitor"
    title = "Gradient Doctor GradientMonitor JSONL"
    expects = "GradientMonitor JSONL (step, total_norm, grad_norms per line)"
    priority = 5

    def sniff(self, sample: Sample) -> float:
        hits = 0
        for record in json_objects(sample.lines):
            if record.get("gradient_doctor") == HEADER_KIND or record.keys() >= SIGNATURE:
                hits += 1
        return 1e6 + hits if hits else 0.0

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        layers: list[str] | None = None
        for record in json_objects(text_lines(path, stats)):
            if record.get("gradient_doctor") == HEADER_KIND:
                layers = [str(v) for v in record.get("layers") or []]
                parameters = [str(v) for v in record.get("parameters") or []]
                shapes = [list(s) for s in record.get("shapes") or []]
                kinds = record.get("layer_types") or {}
                if parameters and len(parameters) == len(layers):
                    stats.run = {
                        "parameters": parameters,
                        "param_layers": layers,
                        "weight_layers": weight_layers(layers, shapes, kinds),
                    }
                continue
            if not record.keys() >= SIGNATURE:
                continue
            yield step_fields(record, layers)


def dumps(record: dict[str, Any]) -> str:
    """One JSONL line the way the monitor writes it (NaN/Infinity as JSON literals)."""
    return json.dumps(record, allow_nan=True, separators=(",", ":"))
