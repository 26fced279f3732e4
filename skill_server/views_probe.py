"""Markdown view of a runtime probe result (never imports torch; no statistics computed here)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.norms import norm_summary, records_from_series
from gradient_doctor.probes.runtime.result import ProbeResult, optimizer_label
from gradient_doctor.templates import render

SEVERITY_MARK = {"critical": "❌", "warning": "⚠️", "info": "ℹ️"}
STATUS_TEXT = {
    "ok": "the script finished by itself",
    "stopped": "stopped by the probe after the requested steps",
    "script-error": "the script raised an error",
    "timeout": "the script ran past the time limit",
    "no-training-loop": "no optimizer step happened",
    "out-of-memory": "the script ran out of memory",
}
MAX_LAYER_ROWS = 12


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def _snippet_code(snippet_id: str | None) -> str | None:
    if snippet_id is None:
        return None
    try:
        from gradient_doctor.templates.snippets import render_snippet

        return render_snippet(snippet_id)
    except Exception:  # a missing snippet must not break the report
        return None


def _finding_view(finding: Finding) -> dict[str, Any]:
    where = []
    if finding.step is not None:
        where.append(f"step {finding.step}")
    if finding.parameter:
        where.append(f"parameter `{finding.parameter}`")
    if finding.module:
        where.append(f"module `{finding.module}`")
    evidence = ", ".join(
        f"{key}={_fmt(value)}" for key, value in finding.evidence.items() if key != "origin"
    )
    return {
        "id": finding.id,
        "severity": finding.severity,
        "mark": SEVERITY_MARK[finding.severity],
        "message": finding.message,
        "where": ", ".join(where),
        "evidence": evidence,
        "fix": finding.fix.description if finding.fix else None,
        "snippet_id": finding.fix.snippet_id if finding.fix else None,
    }


def _where_it_ran(result: ProbeResult) -> list[tuple[str, str]]:
    """Rows saying which interpreter ran the script and why, and what its supervisor saw."""
    rows: list[tuple[str, str]] = []
    chosen = result.interpreter
    if chosen is not None:
        versions = ", ".join(
            f"{name} {value}"
            for name, value in (("Python", chosen.python_version), ("torch", result.torch_version))
            if value
        )
        rows.append(("Interpreter", f"`{chosen.path}` ({versions}): {chosen.reason}"))
    seen = result.isolation
    if seen is not None:
        rows.append(("Working folder", f"`{seen.working_dir}`"))
        if seen.max_memory:
            rows.append(("Memory cap", f"{seen.max_memory / 2**20:g} MiB"))
        if seen.parent_signals:
            rows.append(("Signals to its parent", "; ".join(seen.parent_signals)))
        if seen.parent_killed:
            rows.append(("Its parent process was killed", seen.parent_killed))
        if seen.left_behind:
            rows.append(("Processes it left running, stopped", ", ".join(seen.left_behind)))
    return rows


def prepare_markdown() -> None:
    """Compile the report's template and import the fix snippets' module now, so that
    :func:`probe_markdown` does not do it after the run (the CLI calls this while the script
    runs, in its low-priority preparation thread)."""
    from gradient_doctor.templates import environment
    from gradient_doctor.templates.snippets import get_snippet  # noqa: F401

    environment().get_template("probe.md.j2")


def _mean_loss(losses: list[float | None]) -> float | None:
    """The step's loss (mean of its backward() losses) when all are finite, else None."""
    present = [v for v in losses if v is not None]
    if not present or not all(math.isfinite(v) for v in present):
        return None
    return sum(present) / len(present)


def probe_markdown(result: ProbeResult) -> str:
    """The Markdown report of ``result``: status, summary numbers, findings, fix code."""
    norms = [n for n in result.total_norm if math.isfinite(n)]
    losses = [v for v in result.loss if v is not None and math.isfinite(v)]
    summary = [
        ("Steps measured", f"{result.steps} of {result.steps_requested}"),
        ("Device", result.device),
        ("Threshold profile", result.profile),
        *_where_it_ran(result),
    ]
    indices = sorted({r.optimizer for r in result.records})
    if len(indices) > 1:
        # One series per optimizer (a GAN, actor-critic): their norms are not one curve.
        parts = []
        for index in indices:
            own = [r for r in result.records if r.optimizer == index]
            label = optimizer_label(index, result.optimizer_kinds, result.optimizer_names)
            parts.append(f"{label}: total ‖g‖ {norm_summary(own).text()}")
        summary.append(("Optimizers", "; ".join(parts)))
    else:
        if norms:
            # Before the script's clipping, as the plots draw it (the applied norm of a
            # clipped run sits at max_norm), and what the clip did.
            records = result.records or records_from_series(
                result.model_dump(mode="json", include={"total_norm", "total_norm_before_clip"})
            )
            summary.append(("Total gradient norm", norm_summary(records).text()))
        if result.optimizer_kinds:
            summary.append(("Optimizer", result.optimizer_kinds[0]))
    if len(norms) != len(result.total_norm):
        summary.append(("Non-finite steps", str(len(result.total_norm) - len(norms))))
    if len(indices) > 1:
        # Each optimizer has its own loss (a GAN's discriminator and generator): the first
        # loss of one and the last of the other are no trend.
        per_optimizer = []
        for index in indices:
            own_losses = [
                value
                for r in result.records
                if r.optimizer == index
                for value in [_mean_loss(r.losses)]
                if value is not None
            ]
            if own_losses:
                label = optimizer_label(index, result.optimizer_kinds, result.optimizer_names)
                per_optimizer.append(f"{label}: {own_losses[0]:.4g} → {own_losses[-1]:.4g}")
        if per_optimizer:
            summary.append(("Loss", "; ".join(per_optimizer)))
    elif losses:
        summary.append(("Loss", f"{losses[0]:.4g} → {losses[-1]:.4g}"))
    if result.probe_s and result.script_s:
        summary.append(("Time in the probe", f"{result.probe_s:.3f} s of {result.script_s:.2f} s"))
    layers = []
    for series in result.layer_norms[:MAX_LAYER_ROWS]:
        values = [v for v in series.norms if v is not None]
        finite = [v for v in values if math.isfinite(v)]
        layers.append(
            {
                "layer": series.layer,
                "first": _fmt(values[0]) if values else "—",
                "last": _fmt(values[-1]) if values else "—",
                "median": _fmt(statistics.median(finite)) if finite else "—",
            }
        )
    findings = [_finding_view(f) for f in result.findings]
    snippets: list[dict[str, str]] = []
    seen: set[str] = set()
    for finding in findings:
        snippet_id = finding["snippet_id"]
        if finding["severity"] == "info" or not snippet_id or snippet_id in seen:
            continue
        code = _snippet_code(snippet_id)
        if code:
            seen.add(snippet_id)
            snippets.append({"id": snippet_id, "code": code.rstrip()})
    return render(
        "probe.md.j2",
        r=result,
        status_text=STATUS_TEXT[result.status],
        summary=summary,
        findings=findings,
        layers=layers,
        more_layers=max(0, len(result.layer_norms) - MAX_LAYER_ROWS),
        snippets=snippets,
    )
