"""Plain ``print`` / ``logging`` / Accelerate output: ``key value`` pairs on a line.

``step 10 | loss 2.31 | grad_norm 0.52 | lr 1.0e-03``, ``Epoch 1 Step 10: loss=2.31,
grad norm=0.52``, ``[step 10/1000] train loss: 2.31 lr: 0.001``, llm.c's ``step 1/100 | train
loss 4.3 | norm 1.2 | lr 6e-4``. Keys come from a fixed vocabulary (loss, grad norm, total norm,
gnorm, norm, lr, learning rate, scale, loss scale, step, iter, iteration, global step), spelled
with spaces, ``_`` or ``-``, in any case, followed by ``:``, ``=`` or a space and a number (also
``nan``, ``inf`` or ``tensor(2.31)``). A line counts when it has a loss or a gradient norm; a
line that names a validation or evaluation value is an evaluation line and is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.records import number

_SPELLINGS = {
    "step": ["global step", "step", "iteration", "iter", "update"],
    "loss": ["train loss", "training loss", "loss"],
    "grad_norm": ["grad norm", "gradient norm", "total norm", "gnorm", "norm"],
    "grad_norm_before_clip": ["grad norm before clip", "unclipped grad norm"],
    "lr": ["learning rate", "lr"],
    "scale": ["loss scale", "grad scale", "scale"],
}
_KEY_FIELD: dict[str, str] = {}
_ALTERNATIVES: list[str] = []
for _field, _names in _SPELLINGS.items():
    for _name in _names:
        _KEY_FIELD[_name] = _field
        _ALTERNATIVES.append(_name.replace(" ", r"[ _\-]?"))
# longest spellings first, so "grad norm before clip" wins over "grad norm" and "norm"
_ALTERNATIVES.sort(key=len, reverse=True)
NUMBER = (
    r"(?:tensor\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity))"
)
PAIR = re.compile(
    rf"(?<![A-Za-z0-9_])({'|'.join(_ALTERNATIVES)})(?![A-Za-z0-9])\s*(?:[:=]|is)?\s*{NUMBER}",
    re.IGNORECASE,
)
EVALUATION = re.compile(
    r"\b(val|valid|validation|eval|evaluation|test)[ _/\-]?(loss|ppl|acc)", re.IGNORECASE
)
#: Cheap prefilter: a line without any of these letters has no pair.
_HINTS = ("loss", "norm", "LOSS", "Loss", "Norm", "NORM")


_SEPARATORS = re.compile(r"[ _\-]+")
_field_cache: dict[str, str] = {}


def _field_of(key: str) -> str:
    field = _field_cache.get(key)
    if field is None:
        field = _KEY_FIELD.get(_SEPARATORS.sub(" ", key.lower()), "")
        if len(_field_cache) < 10_000:
            _field_cache[key] = field
    return field


def parse_line(line: str) -> dict[str, Any] | None:
    """The fields a console line prints, or None when it has no loss or gradient norm."""
    if not any(hint in line for hint in _HINTS):
        return None
    pairs = PAIR.findall(line)
    if not pairs:
        return None
    fields: dict[str, Any] = {}
    for key, value in pairs:
        field = _field_of(key)
        if not field or field in fields:
            continue
        try:
            parsed: float | None = float(value)
        except ValueError:
            parsed = number(value)
        if parsed is None:
            continue
        if field == "step":
            if parsed != parsed or parsed < 0 or parsed != int(parsed):
                continue
            fields[field] = int(parsed)
        else:
            fields[field] = parsed
    if "loss" not in fields and "grad_norm" not in fields:
        return None
    if EVALUATION.search(line):
        return None
    return fields


class PlainConsole(LogFormat):
    id = "console"
    title = "console output of print/logging/Accelerate loops"
    expects = "console lines such as 'step 10 | loss 2.31 | grad_norm 0.5 | lr 1e-3'"
    priority = 90

    def sniff(self, sample: Sample) -> float:
        return float(sum(1 for line in sample.lines if parse_line(line) is not None))

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        for line in text_lines(path, stats):
            fields = parse_line(line)
            if fields is not None:
                yield fields

    def line_parser(self) -> Callable[[str], dict[str, Any] | None]:
        return parse_line
