"""Parent-side diagnosis: raw step records + a threshold profile → findings (never imports torch).

The judgements live in ``probes.runtime.signals`` (one module per catalogue id); this module
turns the probe's records into a :class:`~probes.runtime.signals.series.RunSeries`, runs the
signals on it, and assembles the :class:`ProbeResult` the plots and reports are drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.result import ChildSummary, LayerSeries, ProbeResult, StepRecord
from gradient_doctor.probes.runtime.signals import RunSeries, run_signals
from gradient_doctor.probes.runtime.signals.base import warm_knowledge


def resolve_profile(name: str | None = None, *, warm: bool = True) -> ThresholdProfile:
    """The threshold profile ``name`` (default profile when None).

    Only ``thresholds.yaml`` is read here, so the script starts sooner; the rest of the
    knowledge base (fix snippets for the findings) and the signal modules load in a background
    thread (:func:`probes.runtime.signals.base.warm_knowledge`), started here unless ``warm``
    is False (the probe starts it once the script is launched, so that it does not compete
    with the launch)."""
    from gradient_doctor.knowledge.loader import load_thresholds

    profile = load_thresholds().profile(name)
    if warm:
        warm_knowledge()
    return profile


def diagnose(
    records: Sequence[StepRecord], summary: ChildSummary, profile: ThresholdProfile
) -> list[Finding]:
    """Findings for the measured steps, judged with ``profile`` (most severe first)."""
    ordered = sorted(records, key=lambda r: r.step)
    return run_signals(RunSeries.from_probe(ordered, summary), profile)


def build_result(
    *,
    script: str,
    args: list[str],
    steps_requested: int,
    sample_every: int,
    records: list[StepRecord],
    summary: ChildSummary,
    profile: ThresholdProfile,
    wall_s: float,
) -> ProbeResult:
    """Assemble the :class:`ProbeResult`: findings plus the series plots are drawn from."""
    records = sorted(records, key=lambda r: r.step)
    findings = diagnose(records, summary, profile)
    layer_names: list[str] = []
    for layer in summary.layers:
        if layer not in layer_names:
            layer_names.append(layer)
    series: dict[str, list[float | None]] = {layer: [] for layer in layer_names}
    for record in records:
        sums: dict[str, float] = {}
        for layer, norm in zip(summary.layers, record.grad_norms, strict=False):
            if norm is not None:
                sums[layer] = sums.get(layer, 0.0) + norm * norm
        for layer in layer_names:
            series[layer].append(math.sqrt(sums[layer]) if layer in sums else None)
    losses: list[float | None] = []
    for record in records:
        present = [v for v in record.losses if v is not None]
        losses.append(sum(present) / len(present) if present else None)
    message = summary.message
    if summary.status in ("ok", "stopped") and message is None:
        message = None
    return ProbeResult(
        status=summary.status,
        message=message,
        traceback_tail=summary.traceback_tail,
        script=script,
        args=args,
        steps=len(records),
        steps_requested=steps_requested,
        sample_every=sample_every,
        device=summary.device,
        profile=profile.name,
        findings=findings,
        parameters=summary.parameters,
        layers=summary.layers,
        layer_names=layer_names,
        records=records,
        total_norm=[r.total_norm for r in records],
        total_norm_before_clip=[r.total_norm_before_clip for r in records],
        loss=losses,
        layer_norms=[LayerSeries(layer=k, norms=v) for k, v in series.items()],
        optimizer_kinds=list(summary.optimizer_kinds),
        optimizer_names=list(summary.optimizer_names),
        nan_origin=summary.nan_origin,
        wall_s=wall_s,
        script_s=summary.script_s,
        probe_s=summary.probe_s,
        torch_version=summary.torch_version,
    )
