"""``gradient-doctor catalog`` and ``gradient-doctor explain`` through the real CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess

import pytest
from catalog_tables import CATALOG, catalog_rows, catalogue, snapshot_rows

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
    by_id = {e["id"]: e for e in entries}
    rows = catalogue()  # catalog.md, or its checked-in snapshot in a clone
    assert len(rows) >= 80, "the catalogue's rows were not read"
    for row in rows:
        assert row.id in by_id, f"{row.id} missing from catalog --format json"
        assert by_id[row.id]["kind"] == row.kind
        if row.kind == "red-flag":
            assert by_id[row.id]["severity"] == row.severity


def test_catalog_snapshot_matches_catalog_md() -> None:
    """The checked-in rows (what the tests read in a clone) are catalog.md's own."""
    if not CATALOG.is_file():
        pytest.skip(f"catalog.md not found at {CATALOG}: nothing to compare the snapshot with")
    assert snapshot_rows() == catalog_rows(), (
        "catalog.md changed: run python tests/knowledge/catalog_tables.py"
    )


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


def test_explain_a_signal_names_a_fixing_snippet_first(cli: Cli) -> None:
    """A signal is already a measurement: its first snippet fixes, it does not measure again
    (ux review: update-param-ratio led with the norm monitor)."""
    listed = cli("catalog", "--kind", "signal", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    ids = [e["id"] for e in json.loads(listed.stdout)["entries"]]
    assert "update-param-ratio" in ids
    for entry_id in ids:
        if entry_id == "healthy":  # nothing to fix: keep measuring
            continue
        data = json.loads(cli("explain", entry_id, "--format", "json").stdout)
        assert data["snippets"][0] != "grad-norm-monitor", entry_id
    markdown = cli("explain", "update-param-ratio").stdout
    assert "Fix snippets: `vanishing-fixes`, `grad-norm-monitor`" in markdown


def test_explain_spikes_checks_the_clipping_order_first(cli: Cli) -> None:
    """The seed's red flags (a clip after the step, a clip on scaled AMP gradients) let every
    spike through: grad-norm-spikes says to rule them out before tuning max_norm."""
    result = cli("explain", "grad-norm-spikes")
    assert result.returncode == 0, result.stderr
    fix = result.stdout.split("## Fix", 1)[1].split("\n\n", 2)[1]
    assert fix.startswith("First check that the clip acts"), fix
    assert fix.index("unscale_") < fix.index("max_norm"), fix
    assert "Fix snippets: `training-loop-order`, `amp-clip`" in result.stdout
