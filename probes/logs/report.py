"""Diagnose a read log with the runtime signals and describe it: :class:`LogReport`.

The judgement is the probe's: :func:`~probes.runtime.signals.run_signals` on the log's
:class:`~probes.runtime.signals.series.RunSeries`, with the same threshold profile. This module
adds what only a log report needs: which series the log had, which checks they allowed (and
what the others would need), exact counts taken while streaming, and the kept series for plots.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.logs.fields import describe
from gradient_doctor.probes.logs.reader import LogRun, read_log
from gradient_doctor.probes.runtime.signals import all_signals, run_signals
from gradient_doctor.probes.runtime.signals.series import RUN_FIELDS, RunSeries

#: Fields a training log can hold (what a check needing only these could get from a log).
LOG_FIELDS = frozenset(
    {
        "loss",
        "grad_norm",
        "grad_norm_before_clip",
        "lr",
        "scale",
        "skipped",
        "clipped",
        "clip_max_norm",
        "layer_grad_norms",
        "weight_layers",
    }
)
#: Columns of the kept series in the report (plots and ``--format json``).
SERIES_COLUMNS = ("step", "loss", "grad_norm", "grad_norm_before_clip", "lr", "scale")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class Check(_Model):
    """One runtime signal the log's series allowed, or what it would have needed."""

    id: str
    ran: bool
    missing: list[str] = Field(default_factory=list, description="Fields the log lacked.")


class Counts(_Model):
    """Exact counts over every step read (taken while streaming, before any thinning)."""

    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    first_nonfinite_field: str | None = None
    norm_spikes: int = Field(
        default=0, description="Isolated gradient-norm spikes (the spike signal's rule)."
    )
    first_norm_spike_step: int | None = None
    loss_spikes: int = Field(default=0, description="Isolated loss spikes (same rule).")
    first_loss_spike_step: int | None = None
    scale_drops: int = Field(default=0, description="Steps where the GradScaler scale fell.")
    skipped_steps: int = 0


class Summary(_Model):
    """A few numbers of the kept series, for the reader of the report."""

    loss_first: float | None = None
    loss_last: float | None = None
    loss_min: float | None = None
    loss_min_step: int | None = None
    norm_median: float | None = None
    norm_max: float | None = None
    norm_max_step: int | None = None
    lr_first: float | None = None
    lr_max: float | None = None
    lr_last: float | None = None
    scale_first: float | None = None
    scale_min: float | None = None
    scale_last: float | None = None
    clipped_fraction: float | None = Field(
        default=None, description="Share of steps with clipping active (when the log says)."
    )
    clipped_fraction_lr_rising: float | None = Field(
        default=None, description="Same, on the steps where the LR was still rising (warmup)."
    )
    clipped_fraction_after: float | None = Field(
        default=None, description="Same, after the LR stopped rising."
    )


class LogReport(_Model):
    """What ``gradient-doctor logs`` reports for one log."""

    path: str = Field(description="The file (or TensorBoard folder) read.")
    format: str = Field(description="Format id (see `gradient-doctor logs --help`).")
    format_title: str
    files: list[str] = Field(default_factory=list, description="Files read (TensorBoard: many).")
    profile: str = Field(description="Threshold profile the diagnosis used.")
    lines_read: int = Field(description="Lines (or TensorBoard events) read.")
    records: int = Field(description="Records that held a training value.")
    bytes_read: int = 0
    read_s: float = 0.0
    steps_read: int = Field(description="Distinct steps read.")
    first_step: int | None = None
    last_step: int | None = None
    step_numbers: str = Field(description="'logged', or 'record order' when the log has none.")
    series_found: list[str] = Field(description="Step fields the log held.")
    layers: list[str] = Field(default_factory=list, description="Per-layer series found.")
    kept_steps: int = Field(description="Steps in the bounded series the diagnosis judged.")
    sample_stride: int = Field(
        default=1,
        description="Between the first/last steps and the anomalies, one step in this many was "
        "kept (1: every step).",
    )
    counts: Counts = Field(default_factory=Counts)
    summary: Summary = Field(default_factory=Summary)
    findings: list[Finding] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    series: dict[str, list[float | int | None]] | None = Field(
        default=None, description="The kept series by column (step, loss, grad_norm, lr, …)."
    )


def _finite(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def checks_for(series: RunSeries) -> list[Check]:
    """The signals a log could feed: those it fed, and for the others what was missing."""
    available = series.available()
    checks: list[Check] = []
    seen: set[str] = set()
    for signal in all_signals():
        if signal.id in seen or not signal.reads <= (LOG_FIELDS | {"grad_norm"}):
            continue
        seen.add(signal.id)
        missing = sorted(signal.reads - available)
        checks.append(Check(id=signal.id, ran=not missing, missing=missing))
    return checks


def _summary(series: RunSeries) -> Summary:
    steps = series.steps
    out = Summary()
    losses = [(p.step, p.loss) for p in steps if p.loss is not None and math.isfinite(p.loss)]
    if losses:
        out.loss_first, out.loss_last = losses[0][1], losses[-1][1]
        out.loss_min_step, out.loss_min = min(losses, key=lambda item: item[1])
    norms = [
        (p.step, p.grad_norm_before_clip if p.grad_norm_before_clip is not None else p.grad_norm)
        for p in steps
    ]
    finite_norms = [(s, n) for s, n in norms if n is not None and math.isfinite(n)]
    if finite_norms:
        out.norm_median = statistics.median(n for _, n in finite_norms)
        out.norm_max_step, out.norm_max = max(finite_norms, key=lambda item: item[1])
    lrs = _finite([p.lr for p in steps])
    if lrs:
        out.lr_first, out.lr_max, out.lr_last = lrs[0], max(lrs), lrs[-1]
    scales = _finite([p.scale for p in steps])
    if scales:
        out.scale_first, out.scale_min, out.scale_last = scales[0], min(scales), scales[-1]
    clipped = [p for p in steps if p.clipped is not None]
    if clipped:
        out.clipped_fraction = sum(1 for p in clipped if p.clipped) / len(clipped)
        peak = next((p.step for p in steps if p.lr is not None and p.lr == out.lr_max), None)
        if peak is not None and out.lr_first is not None and out.lr_max != out.lr_first:
            rising = [p for p in clipped if p.step < peak]
            after = [p for p in clipped if p.step >= peak]
            if rising:
                out.clipped_fraction_lr_rising = sum(1 for p in rising if p.clipped) / len(rising)
            if after:
                out.clipped_fraction_after = sum(1 for p in after if p.clipped) / len(after)
    return out


def _columns(series: RunSeries) -> dict[str, list[float | int | None]]:
    columns: dict[str, list[float | int | None]] = {}
    for name in SERIES_COLUMNS:
        values = [getattr(p, name) for p in series.steps]
        if name == "step" or any(v is not None for v in values):
            columns[name] = values
    return columns


def build_report(run: LogRun, profile: ThresholdProfile, *, with_series: bool = True) -> LogReport:
    """Judge ``run`` with ``profile`` and describe it."""
    findings = run_signals(run.series, profile)
    stats = run.stats
    fields = {f for f in stats.fields if f not in RUN_FIELDS and f != "step"}
    for name in ("losses", "param_grad_norms", "optimizer"):
        fields.discard(name)
    return LogReport(
        path=str(run.path),
        format=run.format.id,
        format_title=run.format.title,
        files=run.read.files[:50],
        profile=profile.name,
        lines_read=run.read.lines,
        records=run.records,
        bytes_read=run.read.bytes,
        read_s=round(run.read_s, 4),
        steps_read=stats.steps,
        first_step=stats.first_step,
        last_step=stats.last_step,
        step_numbers="logged" if run.numbered else "record order",
        series_found=describe(fields),
        layers=list(stats.layers),
        kept_steps=len(run.series.steps),
        sample_stride=run.stride,
        counts=Counts(
            nonfinite_steps=stats.nonfinite_steps,
            first_nonfinite_step=stats.first_nonfinite_step,
            first_nonfinite_field=stats.first_nonfinite_field,
            norm_spikes=stats.norm_spikes,
            first_norm_spike_step=stats.first_norm_spike_step,
            loss_spikes=stats.loss_spikes,
            first_loss_spike_step=stats.first_loss_spike_step,
            scale_drops=stats.scale_drops,
            skipped_steps=stats.skipped_steps,
        ),
        summary=_summary(run.series),
        findings=findings,
        checks=checks_for(run.series),
        notes=list(run.notes),
        series=_columns(run.series) if with_series else None,
    )


def diagnose_log(
    path: str,
    *,
    profile: str | None = None,
    log_format: str | None = None,
    max_norm: float | None = None,
    with_series: bool = True,
    **limits: int,
) -> LogReport:
    """Read ``path`` and judge it: the one-call API of ``gradient-doctor logs``.

    Raises :class:`~probes.logs.formats.base.LogReadError` (one line) for an unreadable log and
    ``KeyError`` for an unknown profile.
    """
    from gradient_doctor.probes.runtime.diagnose import resolve_profile

    chosen = resolve_profile(profile)
    run = read_log(
        path,
        spike_factor=chosen.spike_factor.value,
        log_format=log_format,
        max_norm=max_norm,
        **dict[str, Any](limits),
    )
    return build_report(run, chosen, with_series=with_series)
