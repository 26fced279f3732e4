"""CSV (and TSV) tables with a header row: Lightning's ``CSVLogger`` ``metrics.csv`` and others.

Lightning writes one row per logging call with empty cells for the metrics not logged then
(``epoch,step,train_loss,grad_2.0_norm_total,lr-AdamW``); rows sharing a step are merged. The
header is mapped once; each row is read with the stdlib ``csv`` reader as it streams by.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, ReadStats, Sample, text_lines
from gradient_doctor.probes.logs.records import TRAINING_FIELDS, classify, map_record


def _dialect(header_line: str) -> str:
    return "\t" if header_line.count("\t") > header_line.count(",") else ","


def header_fields(header: list[str]) -> set[str]:
    """The step fields a header's columns name."""
    found: set[str] = set()
    for column in header:
        field, layer = classify(column)
        if field is not None:
            found.add(field)
        elif layer is not None:
            found.add("layer_grad_norms")
    return found


class CsvTable(LogFormat):
    id = "csv"
    title = "CSV table (Lightning CSVLogger metrics.csv, pandas, hand-written)"
    expects = "CSV/TSV with a header row naming loss, grad_norm or lr columns"
    priority = 40

    def sniff(self, sample: Sample) -> float:
        lines = [line for line in sample.lines if line.strip()]
        if len(lines) < 2:
            return 0.0
        delimiter = _dialect(lines[0])
        if delimiter not in lines[0]:
            return 0.0
        header = next(csv.reader([lines[0]], delimiter=delimiter))
        if not TRAINING_FIELDS.intersection(header_fields(header)):
            return 0.0
        width = len(header)
        rows = sum(1 for line in lines[1:] if line.count(delimiter) + 1 == width)
        return float(rows)

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        lines = text_lines(path, stats)
        first = next(lines, None)
        if first is None:
            return
        delimiter = _dialect(first)
        header = next(csv.reader([first], delimiter=delimiter))
        wanted = [(i, name) for i, name in enumerate(header) if any(classify(name))]
        for row in csv.reader(lines, delimiter=delimiter):
            record = {name: row[i] for i, name in wanted if i < len(row) and row[i] != ""}
            if record:
                yield map_record(record)

    def line_parser(self) -> Callable[[str], dict[str, Any] | None]:
        """One row at a time (the first line is the header). A quoted cell holding a line
        break would be read differently than by :meth:`records`; metric tables have none."""
        header: dict[str, Any] = {}

        def parse(line: str) -> dict[str, Any] | None:
            if not header:
                header["delimiter"] = _dialect(line)
                names = next(csv.reader([line], delimiter=header["delimiter"]))
                header["wanted"] = [(i, n) for i, n in enumerate(names) if any(classify(n))]
                return None
            for row in csv.reader([line], delimiter=header["delimiter"]):
                record = {
                    name: row[i] for i, name in header["wanted"] if i < len(row) and row[i] != ""
                }
                if record:
                    return map_record(record)
            return None

        return parse
