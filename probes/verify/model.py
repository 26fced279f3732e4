"""The verification result: one patch, two probed runs, compared (never imports torch).

This is the ``"verification"`` object of ``gradient-doctor check --verify --format json`` and of
the MCP ``diagnose(verify=true)`` result (design.md, "``check --verify``"). The status words are
defined in :mod:`probes.verify.compare`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.knowledge.findings import Severity
from gradient_doctor.probes.runtime.result import SeedingInfo

VerificationStatus = Literal["fixed", "improved", "unchanged", "worse", "broken", "no-patch"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class FoundId(_Model):
    """One catalogue id found in a run (static analysis of the text that ran + its probe)."""

    id: str
    severity: Severity = Field(description="The worst severity any source gave it.")
    sources: list[Literal["static", "runtime"]]


class RunSide(_Model):
    """One side of the comparison: the original script or its patched copy."""

    status: str | None = Field(
        default=None,
        description="The probe's status (ok, stopped, script-error, timeout, no-training-loop, "
        "out-of-memory); None when this side was not run (the patch did not apply or parse).",
    )
    steps: int = Field(default=0, description="Optimizer steps measured.")
    steps_requested: int = 0
    message: str | None = Field(default=None, description="Why the run ended, when not ok.")
    traceback_tail: str | None = Field(default=None, description="The end of its traceback.")
    findings: list[FoundId] = Field(default_factory=list)
    steps_axis: list[int] = Field(
        default_factory=list, description="Optimizer step of each value of the two series."
    )
    loss: list[float | None] = Field(
        default_factory=list, description="Loss given to backward() per step (mean of the step)."
    )
    total_norm: list[float | None] = Field(
        default_factory=list,
        description="Total gradient norm the step applied (the first optimizer's, when the "
        "script has several).",
    )
    loss_first: float | None = None
    loss_last: float | None = None
    norm_median: float | None = Field(
        default=None,
        description="Median total gradient norm as the backward produced it (before the "
        "script's clip when that clip shaped the update; GradScaler-skipped steps left out).",
    )
    norm_max: float | None = Field(
        default=None, description="Largest such norm (raw, as norm_median)."
    )
    operations: dict[str, int] = Field(
        default_factory=dict,
        description="Steps in which each gradient operation ran (the probe's event names: "
        "backward, clip, clip-value, step, scaler-step, unscale, zero-grad, ...).",
    )
    wall_s: float | None = Field(default=None, description="Wall time of this run, seconds.")
    seeding: SeedingInfo | None = None


class Verification(_Model):
    """A patch applied to a scratch copy of the script, both probed alike, and compared."""

    status: VerificationStatus
    verdict: str = Field(description="One line: the status and what it rests on.")
    patch: str | None = Field(default=None, description="The unified diff that was verified.")
    targets: list[str] = Field(
        default_factory=list, description="Finding ids whose patches were applied."
    )
    resolved: list[str] = Field(default_factory=list, description="Ids found before and not after.")
    remaining: list[str] = Field(default_factory=list, description="Ids found before and after.")
    new: list[str] = Field(default_factory=list, description="Ids found after only.")
    unsafe: bool = Field(
        default=False,
        description="The patch broke the script (status broken), or the patched copy no longer "
        "runs an operation the original ran (clipping, the update, backward; status worse): do "
        "not apply it as it is.",
    )
    deterministic: bool | None = Field(
        default=None,
        description="Both runs started from the same weights and first batch; None: not known.",
    )
    notes: list[str] = Field(
        default_factory=list, description="Seeding and determinism, in sentences."
    )
    before: RunSide
    after: RunSide | None = Field(default=None, description="None when nothing was applied.")
    overlapped: bool = Field(default=False, description="The two runs ran at the same time.")
    wall_s: float = Field(default=0.0, description="Wall time of the whole verification.")
