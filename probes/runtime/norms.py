"""The total gradient norm as the script produced it, and what its clipping did to it.

One reading for every view of a probe run (the probe's markdown report, the diagnosis'
"Total grad norm" row, the plots): a script that clips (``clip_grad_norm_``) applies the
clipped norm, which sits at ``max_norm`` whenever the clip cuts; reporting that would hide
how large the gradients really are (nanoGPT: applied median 1.0, raw norm 4.7-6.4). So the
reports give the raw norm (before the clip), and separately how often and by how much the
clip cut.

Parent side: no torch, plain Python over :class:`~.result.StepRecord`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradient_doctor.probes.runtime.result import StepRecord


def clip_shaped_update(record: StepRecord) -> bool:
    """Whether the script's clip in this step ran between its last ``backward()`` and its
    ``step()``, so that the update used the clipped gradients. A clip after the step (seen at
    the start of the next step's calls, before its ``zero_grad``/``backward``) measured and
    cut gradients that were already applied and then thrown away. Without the call order
    (older results) a measured clip counts as applied."""
    if record.total_norm_before_clip is None:
        return False
    events = record.events or []
    if "clip" not in events or "step" not in events:
        return True
    step = events.index("step")
    backwards = [i for i, event in enumerate(events[:step]) if event == "backward"]
    clips = [i for i, event in enumerate(events[:step]) if event == "clip"]
    return bool(clips) and (not backwards or clips[-1] > backwards[-1])


def raw_norm(record: StepRecord) -> float:
    """The norm the step's own backward produced: before the script's clip when that clip
    shaped the update; otherwise the applied norm (a clip after the step measured the previous
    step's gradients, not these)."""
    before = record.total_norm_before_clip
    return before if before is not None and clip_shaped_update(record) else record.total_norm


def _cut(record: StepRecord) -> float | None:
    """By how much the clip divided this step's gradients (raw / applied); None when the clip
    did not shape this step's update or did not change it."""
    before = record.total_norm_before_clip
    if before is None or not clip_shaped_update(record):
        return None
    applied = record.total_norm
    if not (math.isfinite(before) and math.isfinite(applied)) or applied <= 0:
        return None
    if record.clipped is False or before <= applied * (1 + 1e-6):
        return None
    return before / applied


@dataclass(frozen=True)
class NormSummary:
    """Raw total norms of a run (or of one optimizer's steps) and its clip's work."""

    steps: int
    median: float | None
    maximum: float | None
    before_clip: bool
    """True when the numbers are before the script's clipping (the clip shaped the update)."""
    max_norm: float | None = None
    clip_steps: int = 0
    """Steps whose update the clip shaped (the clip ran between backward and step)."""
    cut_steps: int = 0
    """Of those, steps whose gradients the clip scaled down."""
    cut_median: float | None = None
    cut_max: float | None = None
    clip_after_step: bool = False

    def text(self) -> str:
        """``median 5.1, max 6.4 before clipping (30 steps); the clip (max_norm 1) cut 30 of
        30 steps, by 5.1× median (6.4× max)``."""
        if self.median is None or self.maximum is None:
            return f"no finite norm ({self.steps} steps)"
        when = " before clipping" if self.before_clip else ""
        text = f"median {self.median:.3g}, max {self.maximum:.3g}{when} ({self.steps} steps)"
        limit = f" (max_norm {self.max_norm:g})" if self.max_norm is not None else ""
        if self.clip_steps:
            text += f"; the clip{limit} cut {self.cut_steps} of {self.clip_steps} steps"
            if self.cut_median is not None and self.cut_max is not None:
                text += f", by {self.cut_median:.3g}× median ({self.cut_max:.3g}× max)"
        elif self.clip_after_step:
            text += f"; the clip{limit} ran after the step and cut nothing the update used"
        return text


def norm_summary(records: Sequence[StepRecord]) -> NormSummary:
    """The raw-norm summary of ``records`` (skipped GradScaler steps carry no norm)."""
    counted = [r for r in records if not r.skipped]
    values = sorted(v for v in (raw_norm(r) for r in counted) if math.isfinite(v))
    shaped = [r for r in counted if clip_shaped_update(r)]
    cuts = sorted(c for c in (_cut(r) for r in shaped) if c is not None)
    limits = [r.clip_max_norm for r in shaped or counted if r.clip_max_norm is not None]
    return NormSummary(
        steps=len(counted),
        median=statistics.median(values) if values else None,
        maximum=values[-1] if values else None,
        before_clip=bool(shaped),
        max_norm=statistics.median(limits) if limits else None,
        clip_steps=len(shaped),
        cut_steps=len(cuts),
        cut_median=statistics.median(cuts) if cuts else None,
        cut_max=cuts[-1] if cuts else None,
        clip_after_step=not shaped and any(r.total_norm_before_clip is not None for r in counted),
    )


def records_from_series(measurements: dict[str, Any]) -> list[StepRecord]:
    """Step records from a report's ``records`` (or, when a large report dropped them, from
    its ``total_norm`` / ``total_norm_before_clip`` series); [] when neither is readable."""
    raw = measurements.get("records")
    if isinstance(raw, list) and raw:
        try:
            return [StepRecord.model_validate(r) for r in raw]
        except ValueError:
            pass
    applied = measurements.get("total_norm")
    before = measurements.get("total_norm_before_clip") or []
    if not isinstance(applied, list):
        return []
    records = []
    for index, value in enumerate(applied):
        clip = before[index] if index < len(before) else None
        try:
            records.append(
                StepRecord.model_validate(
                    {
                        "step": index + 1,
                        "grad_norms": [],
                        "total_norm": value,
                        "total_norm_before_clip": clip,
                    }
                )
            )
        except ValueError:
            return []
    return records
