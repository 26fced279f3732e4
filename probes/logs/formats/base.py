"""What a log format is: how to recognise a file of it, and how to stream its records.

A module under ``probes/logs/formats/`` defines one :class:`LogFormat` subclass. Detection
(:func:`probes.logs.detect.detect`) reads a :class:`Sample` of the file's start and asks every
format for a score; the best one reads the whole file as a stream of records, each already
mapped onto step fields (``probes.logs.records.map_record``). A format never holds the file in
memory: records are yielded as lines (or events) are read.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, cast

#: Bytes of a file read to recognise its format.
SAMPLE_BYTES = 1 << 20
#: Lines of the sample a format looks at.
SAMPLE_LINES = 2000


class LogReadError(Exception):
    """A log that cannot be read; ``str(error)`` is one line naming the file and why."""


@dataclass
class Sample:
    """The start of a file (or a folder's listing), for recognising its format."""

    path: Path
    text: str
    lines: list[str]
    complete: bool
    """True when the sample holds the whole file."""


@dataclass
class ReadStats:
    """What reading a file met: lines (or events), how many carried a record, bytes read."""

    lines: int = 0
    records: int = 0
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Things the reader learnt about the run (e.g. parameter names from a monitor header)."""
    run: dict[str, Any] = field(default_factory=dict)
    """Run-level RunSeries fields the log states (parameters, param_layers, weight_layers)."""


def open_text(path: Path) -> IO[bytes]:
    """``path`` opened for binary line reading (gzip-compressed when it ends in ``.gz``)."""
    if path.suffix == ".gz":
        return cast(IO[bytes], gzip.open(path, "rb"))
    return path.open("rb", buffering=1 << 20)


def text_lines(path: Path, stats: ReadStats) -> Iterator[str]:
    """The lines of ``path`` as text, one at a time (undecodable bytes replaced)."""
    stats.files.append(str(path))
    with open_text(path) as handle:
        for raw in handle:
            stats.lines += 1
            stats.bytes += len(raw)
            yield raw.decode("utf-8", "replace")


class LogFormat:
    """Base class of the log formats. Subclasses fill the class attributes and the methods."""

    id: ClassVar[str]
    """Short name, used by ``--log-format`` and in the report."""
    title: ClassVar[str]
    """What writes it, in a few words."""
    expects: ClassVar[str]
    """What a file of this format looks like (named in the error for an unknown file)."""
    priority: ClassVar[int]
    """Order among formats with the same score: lower wins (specific before generic)."""
    numbered: ClassVar[bool] = True
    """True when its records carry step numbers (else steps are counted in record order)."""
    folder: ClassVar[bool] = False
    """True when it reads folders (TensorBoard log dirs)."""
    json_values: ClassVar[bool] = False
    """True when its numbers are JSON numbers (``NaN``, ``Infinity``; no ``+5``, ``.5``)."""

    def sniff(self, sample: Sample) -> float:
        """How well the sample fits this format: 0 not at all, higher is better (a count of
        matching lines, or a large constant for an unmistakable signature)."""
        raise NotImplementedError

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        """The file's records as step fields, in file order."""
        raise NotImplementedError

    def line_parser(self) -> Callable[[str], dict[str, Any] | None] | None:
        """For a format read line by line: a fresh parser of one line (its record's step
        fields, or None), giving exactly what :meth:`records` yields for that line, in order.
        ``probes.logs.fastpath`` then reads runs of same-shaped lines as columns. None: the
        format has none (it is read with :meth:`records` only)."""
        return None

    def __repr__(self) -> str:
        return f"<LogFormat {self.id}>"
