"""The log formats ``gradient-doctor logs`` reads: one module per format, discovered.

Each module defines one :class:`~probes.logs.formats.base.LogFormat` subclass: how to recognise
a file of it from the file's start, and how to stream its records. Nothing lists them by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from gradient_doctor.probes.logs.formats.base import LogFormat, LogReadError, ReadStats, Sample

__all__ = ["LogFormat", "LogReadError", "ReadStats", "Sample", "all_formats", "format_by_id"]


@lru_cache(maxsize=1)
def _discover() -> tuple[LogFormat, ...]:
    found: list[LogFormat] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, LogFormat)
                and value is not LogFormat
                and value.__module__ == module.__name__
            ):
                found.append(value())
    return tuple(sorted(found, key=lambda f: (f.priority, f.id)))


def all_formats() -> list[LogFormat]:
    """Every log format, most specific first."""
    return list(_discover())


def format_by_id(format_id: str) -> LogFormat:
    """The format named ``format_id`` (``KeyError`` naming the known ones otherwise)."""
    for fmt in _discover():
        if fmt.id == format_id:
            return fmt
    known = ", ".join(f.id for f in _discover())
    raise KeyError(f"unknown log format {format_id!r}; known: {known}")
