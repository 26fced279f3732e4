"""nanoGPT-style console output: ``iter 100: loss 2.3456, time 12.34ms, mfu 12.34%``.

Karpathy's nanoGPT (and the many training scripts written after it) print one such line every
``log_interval`` iterations; the evaluation lines (``step 250: train loss 1.91, val loss 1.99``)
are estimates over held-out batches, not training steps, and are skipped. Extra ``key value``
pairs on an iter line (``lr 6e-4``, ``norm 0.9``, ``grad_norm 0.9``) are read too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.records import number

NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf)"
ITER = re.compile(rf"\biter\s+(\d+)\s*:\s*loss\s+({NUMBER})")
EXTRA = re.compile(rf"\b(lr|norm|grad_norm|gnorm|scale)\s*[:=]?\s*({NUMBER})")
_EXTRA_FIELDS = {
    "lr": "lr",
    "norm": "grad_norm",
    "grad_norm": "grad_norm",
    "gnorm": "grad_norm",
    "scale": "scale",
}


def parse_iter(line: str) -> dict[str, Any] | None:
    """The fields of one ``iter N: loss X`` line, or None."""
    match = ITER.search(line)
    if match is None:
        return None
    fields: dict[str, Any] = {"step": int(match.group(1)), "loss": number(match.group(2))}
    for key, value in EXTRA.findall(line[match.end() :]):
        parsed = number(value)
        if parsed is not None:
            fields.setdefault(_EXTRA_FIELDS[key], parsed)
    return fields


class NanoGptConsole(LogFormat):
    id = "nanogpt"
    title = "nanoGPT-style console output"
    expects = "nanoGPT lines such as 'iter 100: loss 2.3456, time 12.34ms'"
    priority = 20

    def sniff(self, sample: Sample) -> float:
        return float(sum(1 for line in sample.lines if ITER.search(line)))

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        for line in text_lines(path, stats):
            fields = _parse(line)
            if fields is not None:
                yield fields

    def line_parser(self) -> Callable[[str], dict[str, Any] | None]:
        return _parse


def _parse(line: str) -> dict[str, Any] | None:
    return parse_iter(line) if "iter" in line else None
