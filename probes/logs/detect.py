"""Which format a path is: a folder or a file, sniffed from its first megabyte.

The checks that need no format come first, each with its own one-line error: a missing path,
an empty file, a binary file that is not a TensorBoard event file, a folder with nothing to read.
Then every format scores a :class:`~probes.logs.formats.base.Sample` of the file; the highest
score wins (ties go to the more specific format). A file no format recognises gets one line
naming what was expected.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from gradient_doctor.probes.logs.formats import LogFormat, all_formats, format_by_id
from gradient_doctor.probes.logs.formats.base import (
    SAMPLE_BYTES,
    SAMPLE_LINES,
    LogReadError,
    Sample,
    open_text,
)
from gradient_doctor.probes.logs.formats.tensorboard import MARKER

#: Files a folder is searched for, best first, when it has no TensorBoard event files.
FOLDER_FILES = ("metrics.csv", "trainer_state.json", "*.jsonl", "*.csv", "*.log", "*.txt")


def expected() -> str:
    """What the reader understands, as one clause."""
    return "; ".join(f.expects for f in all_formats())


#: Bytes that do not occur in text logs (control characters other than tab, newlines, form
#: feed, backspace and the escape of terminal colours).
_CONTROL = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27))


def _binary(data: bytes) -> bool:
    """NUL bytes, or more than 5 % control characters or undecodable bytes."""
    if b"\x00" in data:
        return True
    if not data:
        return False
    control = len(data) - len(data.translate(None, _CONTROL))
    undecodable = data.decode("utf-8", "replace").count("\ufffd")
    return (control + undecodable) > 0.05 * len(data)


def _walk(folder: Path, limit: int = 20_000) -> list[Path]:
    """Files under ``folder`` (a bounded, error-tolerant walk: a home folder is not indexed)."""
    found: list[Path] = []
    seen = 0
    for root, dirs, files in os.walk(folder, onerror=lambda error: None):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            found.append(Path(root) / name)
        seen += len(files) + len(dirs)
        if seen > limit:
            break
    return found


def read_sample(path: Path) -> Sample:
    """The first megabyte of ``path`` as text lines (errors for empty and binary files)."""
    try:
        with open_text(path) as handle:
            data = handle.read(SAMPLE_BYTES)
            complete = not handle.read(1)
    except OSError as exc:
        raise LogReadError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not data.strip():
        raise LogReadError(f"{path}: the file is empty")
    if _binary(data[:65536]):
        raise LogReadError(
            f"{path}: a binary file, not a training log (TensorBoard event files are read when "
            f"their name contains '{MARKER}')"
        )
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    if not complete and lines:
        lines.pop()  # cut mid-line
    return Sample(path=path, text=text, lines=lines[:SAMPLE_LINES], complete=complete)


def resolve(path: Path) -> Path:
    """The file (or TensorBoard folder) to read for ``path``."""
    if not path.exists():
        raise LogReadError(f"{path}: no such file or folder")
    if path.is_file():
        return path
    if not path.is_dir():
        raise LogReadError(f"{path}: not a regular file or folder")
    files = _walk(path)
    if any(MARKER in f.name for f in files):
        return path
    for pattern in FOLDER_FILES:
        found = [f for f in files if fnmatch.fnmatch(f.name, pattern)]
        if found:
            # the newest checkpoint's trainer_state.json, the last version's metrics.csv
            return max(found, key=_mtime)
    raise LogReadError(
        f"{path}: a folder with no training log in it (looked for TensorBoard event files, "
        f"metrics.csv, trainer_state.json, *.jsonl, *.csv, *.log, *.txt)"
    )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def detect(path: Path, forced: str | None = None) -> tuple[Path, LogFormat]:
    """The file to read and its format (``forced``: a format id chosen by the caller)."""
    target = resolve(path)
    if target.is_dir() or MARKER in target.name:
        fmt = format_by_id("tensorboard")
        if forced is not None and forced != fmt.id:
            raise LogReadError(f"{path}: TensorBoard event files, not {forced}")
        return target, fmt
    sample = read_sample(target)
    if forced is not None:
        return target, format_by_id(forced)
    best: tuple[float, LogFormat] | None = None
    for fmt in all_formats():
        score = fmt.sniff(sample)
        if score > 0 and (best is None or score > best[0]):
            best = (score, fmt)
    if best is None:
        raise LogReadError(
            f"{target}: not a training log this reader recognises; it expects one of: {expected()}"
        )
    return target, best[1]
