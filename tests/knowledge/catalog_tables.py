"""Read the identifier tables of ``../shared/catalog.md`` (§1–§4) for the knowledge tests.

``../shared`` exists only in the team's workspace, not in a clone of the repository, so the
rows are also checked in as ``catalog_ids.json`` (:func:`catalogue`): the tests compare the
knowledge base with it everywhere, and ``test_catalog_snapshot_matches_catalog_md`` keeps it
equal to catalog.md wherever catalog.md is present (rewrite it with
``python tests/knowledge/catalog_tables.py`` after the catalogue changes).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO.parent / "shared" / "catalog.md"
SNAPSHOT = Path(__file__).with_name("catalog_ids.json")

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


def snapshot_rows(path: Path = SNAPSHOT) -> list[CatalogRow]:
    """The rows as checked in (``catalog_ids.json``)."""
    return [CatalogRow(**row) for row in json.loads(path.read_text(encoding="utf-8"))]


def catalogue() -> list[CatalogRow]:
    """The catalogue's rows: from catalog.md where it exists, else the checked-in snapshot."""
    return catalog_rows() if CATALOG.is_file() else snapshot_rows()


def write_snapshot() -> None:
    """Rewrite ``catalog_ids.json`` from catalog.md."""
    rows = [asdict(row) for row in catalog_rows()]
    text = "[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n"
    SNAPSHOT.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write_snapshot()
