"""Generic JSON Lines: one JSON object per line, with loss / grad_norm / lr keys.

Written by hand-rolled loggers (``f.write(json.dumps({"step": s, "loss": l}) + "\\n")``), by
W&B-style exporters and by many trainers' ``metrics.jsonl``. Nested objects are flattened with
``/`` (``{"train": {"loss": 1}}`` reads as ``train/loss``). Lines that are not JSON objects are
skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.records import TRAINING_FIELDS, map_record


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects flattened one key per leaf (``a/b``)."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def json_objects(lines: Iterator[str] | list[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``lines`` (other lines skipped)."""
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


class JsonLines(LogFormat):
    id = "jsonl"
    title = "JSON Lines"
    expects = "JSON Lines: one object per line with a loss, grad_norm or lr key"
    priority = 50

    def sniff(self, sample: Sample) -> float:
        hits = 0
        for record in json_objects(sample.lines):
            if TRAINING_FIELDS.intersection(map_record(flatten(record))):
                hits += 1
        return float(hits)

    json_values = True

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        for record in json_objects(text_lines(path, stats)):
            yield map_record(flatten(record) if _nested(record) else record)

    def line_parser(self) -> Callable[[str], dict[str, Any] | None]:
        return _parse


def _parse(line: str) -> dict[str, Any] | None:
    for record in json_objects([line]):
        return map_record(flatten(record) if _nested(record) else record)
    return None


def _nested(record: dict[str, Any]) -> bool:
    return any(isinstance(v, dict) for v in record.values())
