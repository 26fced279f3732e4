"""The Markdown view of a probe result (no subprocess)."""

from __future__ import annotations

from gradient_doctor.knowledge.findings import Finding, Fix
from gradient_doctor.probes.runtime.result import ProbeResult
from gradient_doctor.skill_server.views_probe import probe_markdown


def _result(**extra: object) -> ProbeResult:
    data: dict[str, object] = {
        "status": "stopped",
        "script": "train.py",
        "steps": 3,
        "steps_requested": 3,
        "sample_every": 10,
        "profile": "default",
        "total_norm": [1.0, 2.0, float("nan")],
        "loss": [2.0, 1.5, None],
    }
    data.update(extra)
    return ProbeResult.model_validate(data)


def test_markdown_lists_findings_with_evidence_and_snippet_code() -> None:
    finding = Finding(
        id="exploding-gradients",
        severity="critical",
        message="Norm reached 5000.",
        origin="runtime",
        step=2,
        evidence={"max_norm": 5000.0, "profile": "default"},
        fix=Fix(description="Clip the norm.", snippet_id="clip-norm"),
    )
    text = probe_markdown(_result(findings=[finding]))
    assert "`exploding-gradients`" in text and "(step 2)" in text
    assert "max_norm=5000" in text
    assert "clip_grad_norm_" in text  # the snippet's code is rendered
    assert "| Non-finite steps | 1 |" in text


def test_markdown_for_a_script_error_shows_message_and_traceback() -> None:
    text = probe_markdown(
        _result(
            status="script-error",
            steps=0,
            total_norm=[],
            loss=[],
            message="ValueError: bad",
            traceback_tail="Traceback ...\nValueError: bad",
        )
    )
    assert "`script-error` — the script raised an error: ValueError: bad" in text
    assert "### The script stopped with" in text
    assert "never reached an optimizer step" in text
