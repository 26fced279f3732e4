"""Merging static and runtime findings into one issue per id, and the report's sections."""

from __future__ import annotations

from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.skill_server.diagnosis import merge_findings, render_report
from gradient_doctor.skill_server.results import Diagnosis, SummaryRow


def _findings() -> list[Finding]:
    return [
        Finding(
            id="clip-after-step",
            severity="critical",
            message="clip on line 58 runs after optimizer.step() on line 57",
            origin="static",
            path="train.py",
            line=58,
            evidence={"step_line": 57},
        ),
        Finding(
            id="clip-after-step",
            severity="critical",
            message="clipping ran after the step in 11 steps",
            origin="runtime",
            step=2,
            evidence={"steps_affected": 11},
        ),
        Finding(
            id="layer-norm-spread",
            severity="warning",
            message="per-layer norms differ by 67x",
            origin="runtime",
            module="embed",
            evidence={"spread": 67.49},
        ),
        Finding(
            id="no-grad-monitoring",
            severity="info",
            message="no gradient norm is measured",
            origin="static",
            path="train.py",
            line=55,
        ),
    ]


def test_one_issue_per_id_with_the_evidence_of_both_probes() -> None:
    issues = merge_findings(_findings(), load_knowledge())
    assert [i.id for i in issues] == ["clip-after-step", "layer-norm-spread", "no-grad-monitoring"]
    clip = issues[0]
    assert clip.sources == ["static", "runtime"]
    assert clip.locations == ["train.py:58", "step 2"]
    assert len(clip.messages) == 2
    assert [e["source"] for e in clip.evidence] == ["static", "runtime"]
    assert clip.title == load_knowledge().get("clip-after-step").title
    assert clip.fix and clip.snippets
    assert issues[1].locations == ["module `embed`"]


def test_report_has_the_check_gradients_sections() -> None:
    issues = merge_findings(_findings(), load_knowledge())
    diagnosis = Diagnosis(
        script="train.py",
        description=None,
        static_checked=True,
        summary=[
            SummaryRow(
                metric="Static red flags", value="2 (1 critical, 1 info)", status="critical"
            ),
            SummaryRow(metric="Runtime probe", value="skipped on request", status="not-run"),
        ],
        issues=issues,
        recommendations=["`clip-after-step`: move the clip before the step."],
        combined_diff=None,
        code_to_add=[],
        worst_severity="critical",
    )
    report = render_report(diagnosis)
    summary = report.index("### Summary")
    detected = report.index("### Issues Detected")
    recommendations = report.index("### Recommendations")
    assert summary < detected < recommendations
    assert "| Static red flags | 2 (1 critical, 1 info) | ❌ |" in report
    assert "| Runtime probe | skipped on request | — |" in report
    assert "1. ❌ **critical** · `clip-after-step`" in report
    assert "2. ⚠️ **warning** · `layer-norm-spread`" in report
    assert "train.py:58; step 2" in report
    assert "steps_affected=11" in report and "spread=67.49" in report
    assert "### Code to Add" not in report


def test_report_header_says_a_planned_stop_is_a_complete_run() -> None:
    """'stopped' means the probe ended the script after the requested steps, as planned;
    the header must not read like a failure."""
    words = {"stopped": "ran the requested steps", "ok": "ran to the end"}
    for status, said in words.items():
        diagnosis = Diagnosis(
            script="train.py",
            description=None,
            static_checked=True,
            probe_status=status,
            summary=[],
            issues=[],
            recommendations=[],
            combined_diff=None,
            code_to_add=[],
            worst_severity=None,
        )
        header = render_report(diagnosis).splitlines()
        checks = next(line for line in header if line.startswith("**Checks:**"))
        assert f"runtime probe ✓ {said}" in checks
        assert "stopped" not in checks


def test_probe_text_block_for_a_failed_run_shows_the_output() -> None:
    from gradient_doctor.skill_server.results import ProbeReport
    from gradient_doctor.templates import render

    report = ProbeReport(
        path="train.py",
        status="script-error",
        steps=0,
        steps_requested=30,
        findings=[],
        measurements={"message": "the script raised", "traceback_tail": "ValueError: bad batch"},
    )
    text = render("server/probe.md.j2", r=report)
    assert "**script-error**, 0 of 30 optimizer steps" in text
    assert "No findings." in text
    assert "```text\nValueError: bad batch\n```" in text
    # Measurements without the optional series still render.
    bare = report.model_copy(update={"measurements": {}, "status": "timeout"})
    assert "**timeout**" in render("server/probe.md.j2", r=bare)
