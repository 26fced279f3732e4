"""The Hugging Face Trainer's console output: one Python dict per logging step.

``{'loss': 0.6793, 'grad_norm': 1.022, 'learning_rate': 0.0095, 'epoch': 0.06}``, printed by
its ``PrinterCallback`` / ``ProgressCallback``, often after a tqdm bar on the same line; recent
versions print each value as a string (``'loss': '0.6793'``), and NaN as ``nan`` or ``'nan'``.
The lines carry no step number, so steps are counted in record order (one per logged record:
``logging_steps`` optimizer steps each). Evaluation dicts (``eval_loss``) and the final summary
(``train_runtime``) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.records import TRAINING_FIELDS, map_record

#: A flat Python dict literal whose first key is quoted.
DICT = re.compile(r"\{'[A-Za-z_][^{}]*\}")
PAIR = re.compile(r"'([^']+)':\s*(?:'([^']*)'|([^,}\s]+))")


def parse_dict(text: str) -> dict[str, Any] | None:
    """The last dict literal of a line as {key: value text}, or None."""
    found = DICT.findall(text)
    if not found:
        return None
    pairs = PAIR.findall(found[-1])
    if not pairs:
        return None
    return {key: quoted or bare for key, quoted, bare in pairs}


class HfTrainerConsole(LogFormat):
    id = "hf-trainer"
    title = "Hugging Face Trainer console output"
    expects = "Hugging Face Trainer lines such as {'loss': 0.69, 'grad_norm': 1.0, ...}"
    priority = 20
    numbered = False

    def sniff(self, sample: Sample) -> float:
        hits = 0
        for line in sample.lines:
            if "{'" not in line:
                continue
            record = parse_dict(line)
            if (
                record
                and "train_runtime" not in record
                and TRAINING_FIELDS.intersection(map_record(record))
            ):
                hits += 1
        return float(hits)

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        for line in text_lines(path, stats):
            fields = _parse(line)
            if fields is not None:
                yield fields

    def line_parser(self) -> Callable[[str], dict[str, Any] | None]:
        return _parse


def _parse(line: str) -> dict[str, Any] | None:
    if "{'" not in line:
        return None
    record = parse_dict(line)
    if record is None or "train_runtime" in record:
        return None
    return map_record(record)
