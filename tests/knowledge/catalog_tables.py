"""Read the identifier tables of ``../shared/catalog.md`` (§1–§4) for the knowledge tests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO.parent / "shared" / "catalog.md"

_KIND_BY_SECTION = {"1": "red-flag", "2": "signal", "3": "rationalization", "4": "symptom"}


@dataclass(frozen=True)
class CatalogRow:
    """One identifier row of the catalogue."""

    id: str
    kind: str
    severity: str | None
    where: str | None
    source: str | None
    number: int | None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def catalog_rows(path: Path = CATALOG) -> list[CatalogRow]:
    """Every identifier row of §1–§4, in document order."""
    rows: list[CatalogRow] = []
    kind: str | None = None
    header: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## (\d+)\.", line)
        if heading:
            kind = _KIND_BY_SECTION.get(heading.group(1))
            header = []
            continue
        if kind is None or not line.startswith("|"):
            continue
        cells = _cells(line)
        if not header:
            header = [c.lower() for c in cells]
            continue
        if set(line.replace("|", "").strip()) <= {"-", " "}:
            continue
        row = dict(zip(header, cells, strict=False))
        match = re.fullmatch(r"`([a-z0-9-]+)`", row.get("id", ""))
        if not match:
            continue
        number = row.get("#")
        rows.append(
            CatalogRow(
                id=match.group(1),
                kind=kind,
                severity=row.get("severity"),
                where=row.get("where"),
                source=row.get("source"),
                number=int(number) if number and number.isdigit() else None,
            )
        )
    return rows
