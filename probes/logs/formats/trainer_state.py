"""Hugging Face Trainer's ``trainer_state.json`` (saved in every checkpoint folder).

One JSON document whose ``log_history`` list holds the records the Trainer logged, each with its
``step``: ``{"loss": 0.69, "grad_norm": 1.02, "learning_rate": 5e-05, "epoch": 0.1, "step": 10}``.
Evaluation records (``eval_loss``) and the final summary (``train_runtime``) are skipped. The file
is small (one record per logging step), so it is parsed whole, within a size limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import (
    LogFormat,
    LogReadError,
    ReadStats,
    Sample,
    open_text,
)
from gradient_doctor.probes.logs.records import map_record

#: Largest trainer_state.json parsed (it is read whole).
MAX_BYTES = 256 << 20


class TrainerState(LogFormat):
    id = "hf-trainer-state"
    title = "Hugging Face Trainer trainer_state.json"
    expects = "a Hugging Face trainer_state.json with a log_history list"
    priority = 10

    def sniff(self, sample: Sample) -> float:
        head = sample.text.lstrip()[:4096]
        if head.startswith("{") and '"log_history"' in sample.text:
            return 1e9
        return 0.0

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        stats.files.append(str(path))
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise LogReadError(
                f"{path}: {size:,} bytes is more than the {MAX_BYTES:,} read whole for a "
                "trainer_state.json"
            )
        with open_text(path) as handle:
            data = handle.read()
        stats.bytes += len(data)
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise LogReadError(f"{path}: not valid JSON ({exc})") from None
        history = document.get("log_history") if isinstance(document, dict) else None
        if not isinstance(history, list):
            raise LogReadError(f"{path}: no log_history list in this trainer_state.json")
        for record in history:
            stats.lines += 1
            if not isinstance(record, dict) or "train_runtime" in record:
                continue
            yield map_record(record)
