"""Markdown view of a log report (``gradient-doctor logs``, ``diagnose_logs``); no statistics
are computed here beyond formatting."""

from __future__ import annotations

from typing import Any

from gradient_doctor.probes.logs.report import LogReport
from gradient_doctor.skill_server.views_probe import _finding_view, _fmt, _snippet_code
from gradient_doctor.templates import render

SERIES_NAMES = {
    "loss": "loss",
    "grad_norm": "grad norm",
    "grad_norm_before_clip": "grad norm before clip",
    "lr": "learning rate",
    "scale": "GradScaler scale",
    "skipped": "skipped steps",
    "clipped": "clipping active",
    "clip_max_norm": "clip max_norm",
    "layer_grad_norms": "per-layer grad norms",
}


def _mb(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count:,} bytes"


def summary_rows(r: LogReport) -> list[tuple[str, str]]:
    """The metric table of the report."""
    s, c = r.summary, r.counts
    span = f" (steps {r.first_step}–{r.last_step})" if r.first_step is not None else ""
    numbering = "" if r.step_numbers == "logged" else ", counted in record order"
    rows = [("Steps read", f"{r.steps_read:,}{span}{numbering}")]
    found = [SERIES_NAMES.get(name, name) for name in r.series_found]
    if r.layers:
        found = [f for f in found if f != SERIES_NAMES["layer_grad_norms"]]
        found.append(f"{len(r.layers)} per-layer grad norms")
    rows.append(("Series found", ", ".join(found) or "—"))
    if r.sample_stride > 1:
        rows.append(
            (
                "Kept for the diagnosis",
                f"{r.kept_steps:,} steps: the first and last ones and every anomaly's "
                f"neighbourhood exactly, 1 in {r.sample_stride} in between",
            )
        )
    if s.loss_first is not None:
        rows.append(
            (
                "Loss",
                f"{_fmt(s.loss_first)} → {_fmt(s.loss_last)} (lowest {_fmt(s.loss_min)} at step "
                f"{s.loss_min_step})",
            )
        )
    if s.norm_median is not None:
        rows.append(
            (
                "Gradient norm",
                f"median {_fmt(s.norm_median)}, largest {_fmt(s.norm_max)} at step "
                f"{s.norm_max_step}",
            )
        )
    if s.lr_first is not None:
        rows.append(
            ("Learning rate", f"{_fmt(s.lr_first)} → {_fmt(s.lr_last)} (peak {_fmt(s.lr_max)})")
        )
    if s.scale_first is not None:
        drops = f"; fell {c.scale_drops:,} times" if c.scale_drops else ""
        rows.append(
            (
                "GradScaler scale",
                f"{_fmt(s.scale_first)} → {_fmt(s.scale_last)} (lowest {_fmt(s.scale_min)}){drops}",
            )
        )
    if c.skipped_steps:
        rows.append(("Skipped steps (overflow)", f"{c.skipped_steps:,}"))
    if c.first_nonfinite_step is not None:
        rows.append(
            (
                "First non-finite value",
                f"step {c.first_nonfinite_step} ({c.first_nonfinite_field}); "
                f"{c.nonfinite_steps:,} non-finite step(s) in all",
            )
        )
    else:
        rows.append(("First non-finite value", "none"))
    spikes = []
    if "grad_norm" in r.series_found or "grad_norm_before_clip" in r.series_found:
        first = f" (first at step {c.first_norm_spike_step})" if c.norm_spikes else ""
        spikes.append(f"{c.norm_spikes:,} in the grad norm{first}")
    if "loss" in r.series_found:
        first = f" (first at step {c.first_loss_spike_step})" if c.loss_spikes else ""
        spikes.append(f"{c.loss_spikes:,} in the loss{first}")
    if spikes:
        where = " before the first non-finite step" if c.first_nonfinite_step is not None else ""
        rows.append(("Isolated spikes" + where, "; ".join(spikes)))
    if s.clipped_fraction is not None:
        phases = ""
        if s.clipped_fraction_lr_rising is not None and s.clipped_fraction_after is not None:
            phases = (
                f" (while the LR rose: {s.clipped_fraction_lr_rising:.0%}; after: "
                f"{s.clipped_fraction_after:.0%})"
            )
        rows.append(("Clipping active", f"{s.clipped_fraction:.0%} of steps{phases}"))
    if r.read_s > 0 and r.bytes_read >= 1_000_000:
        rate = r.bytes_read / r.read_s / 1e6
        rows.append(("Read", f"{_mb(r.bytes_read)} in {r.read_s:.2f} s ({rate:,.1f} MB/s)"))
    return rows


#: The step-series fields a check can lack, as a reader of the report knows them.
_SERIES_WORDS = {
    "scale": "the GradScaler scale",
    "skipped": "skipped steps",
    "layer_grad_norms": "per-layer gradient norms",
    "weight_layers": "per-layer weight norms",
    "clip_max_norm": "the clipping max_norm",
    "clipped": "which steps were clipped",
    "grad_norm_before_clip": "the norm before clipping",
    "grad_norm": "the total gradient norm",
    "loss": "the loss",
    "lr": "the learning rate",
}


def _missing(report: LogReport) -> list[tuple[str, list[str]]]:
    """The checks the log could not feed, grouped by the series they lacked (in words)."""
    groups: dict[str, list[str]] = {}
    for check in report.checks:
        if not check.ran:
            words = [_SERIES_WORDS.get(name, f"`{name}`") for name in check.missing]
            if not words:
                words = ["the series it needs"]
            lacked = ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]
            groups.setdefault(lacked, []).append(check.id)
    return list(groups.items())


def logs_markdown(report: LogReport, *, code: bool = True) -> str:
    """The Markdown report of one log: what was read, findings, what the log allowed, and (with
    ``code``) the fix snippets the findings point at."""
    findings = [_finding_view(f) for f in report.findings]
    snippets: list[dict[str, Any]] = []
    seen: set[str] = set()
    for finding in findings:
        snippet_id = finding["snippet_id"]
        if not code or finding["severity"] == "info" or not snippet_id or snippet_id in seen:
            continue
        text = _snippet_code(snippet_id)
        if text:
            seen.add(snippet_id)
            snippets.append({"id": snippet_id, "code": text.rstrip()})
    return render(
        "logs.md.j2",
        r=report,
        summary=summary_rows(report),
        findings=findings,
        ran=[c.id for c in report.checks if c.ran],
        missing=_missing(report),
        snippets=snippets,
    )
