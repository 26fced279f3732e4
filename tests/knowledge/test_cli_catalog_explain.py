"""``gradient-doctor catalog`` and ``gradient-doctor explain`` through the real CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess

import pytest
from catalog_tables import CATALOG, catalog_rows

Cli = Callable[..., CompletedProcess[str]]


def test_catalog_json_lists_every_catalogue_id_once(cli: Cli) -> None:
    result = cli("catalog", "--format", "json")
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)["entries"]
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), "an id is listed twice"
    for record in entries:
        assert {"id", "kind", "severity", "source"} <= set(record)
        assert record["source"], record["id"]
        if record["kind"] in ("rationalization", "symptom"):
            assert record["severity"] is None
        else:
            assert record["severity"] in ("critical", "warning", "info")
    if not CATALOG.is_file():
        pytest.skip(f"catalog.md not found at {CATALOG}")
    by_id = {e["id"]: e for e in entries}
    for row in catalog_rows():
        assert row.id in by_id, f"{row.id} missing from catalog --format json"
        assert by_id[row.id]["kind"] == row.kind
        if row.kind == "red-flag":
            assert by_id[row.id]["severity"] == row.severity


def test_catalog_kind_filter_and_markdown(cli: Cli) -> None:
    result = cli("catalog", "--kind", "signal", "--format", "json")
    assert result.returncode == 0, result.stderr
    kinds = {e["kind"] for e in json.loads(result.stdout)["entries"]}
    assert kinds == {"signal"}
    markdown = cli("catalog")
    assert markdown.returncode == 0, markdown.stderr
    assert "## Red flags and code rules" in markdown.stdout
    assert "| `clip-after-step` | critical |" in markdown.stdout


def test_explain_known_id(cli: Cli) -> None:
    result = cli("explain", "clip-after-step")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# ")
    assert "`clip-after-step`" in result.stdout and "critical" in result.stdout
    assert "## Fix" in result.stdout and "training-loop-order" in result.stdout
    as_json = cli("explain", "clip-after-step", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["id"] == "clip-after-step" and data["kind"] == "red-flag"
    assert data["severity"] == "critical" and "S" in data["where"]


def test_explain_misspelt_id_names_the_closest(cli: Cli) -> None:
    result = cli("explain", "clip-aftr-step")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "clip-after-step" in lines[0] and "Traceback" not in result.stderr


def test_explain_pages(cli: Cli) -> None:
    thresholds = cli("explain", "thresholds")
    assert thresholds.returncode == 0, thresholds.stderr
    assert "`gs`" in thresholds.stdout and "max_norm" in thresholds.stdout
    tree = cli("explain", "nan-tree", "--format", "json")
    assert tree.returncode == 0, tree.stderr
    assert json.loads(tree.stdout)["root"] == "loss-before-backward"
