"""Typed series of a probe run under data parallelism (no torch; shared by parent and result).

Rank 0 writes one :class:`RankStep` per optimizer step (``probes.runtime.child.distributed``); the
parent assembles them into :class:`DistributedInfo` (``probes.runtime.ranks``), which
``ProbeResult.distributed`` carries.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.probes.runtime.child.rankenv import LAUNCHER_USER


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings")


class RankStep(_Model):
    """What the ranks measured at one optimizer step, merged on rank 0."""

    step: int
    world_size: int
    rank_norms: list[float] = Field(
        description="Per rank: L2 norm of the gradient it holds (its shard, for sharded "
        "parameters), in rank order."
    )
    replicated_norms: list[float] = Field(
        default_factory=list,
        description="Per rank: L2 norm of its replicated (not sharded) gradients, which "
        "synchronised ranks hold identically.",
    )
    max_rel_diff: float = Field(
        default=0.0,
        description="Largest relative difference of a replicated gradient's norm "
        "between a rank and the reference rank.",
    )
    diverging_ranks: list[int] = Field(default_factory=list)
    param_diverging_ranks: list[int] = Field(default_factory=list)
    param_max_rel_diff: float | None = None
    nonfinite_grad_ranks: list[int] = Field(default_factory=list)
    nonfinite_loss_ranks: list[int] = Field(default_factory=list)
    allreduces: int | None = Field(
        default=None,
        description="Gradient all-reduce rounds (one per synchronised backward) "
        "since the previous optimizer step, counted by a DDP communication hook; None when "
        "they could not be counted.",
    )
    allreduce_buckets: int | None = None
    global_grad_norms: dict[int, float] = Field(
        default_factory=dict,
        description="Parameter index → global gradient norm (sqrt of the sum over ranks of "
        "squared local shard norms for sharded parameters, rank 0's norm otherwise).",
    )
    global_numel: dict[int, int] = Field(
        default_factory=dict,
        description="Sampled steps: parameter index → elements of the whole sharded tensor.",
    )
    global_max_abs: dict[int, float] = Field(
        default_factory=dict,
        description="Sampled steps: parameter index → max |g| over every rank's shard.",
    )
    sharded_parameters: int = 0


class DistributedInfo(_Model):
    """The distributed side of a probe run."""

    world_size: int
    launcher: Literal["gradient-doctor", "user"] = LAUNCHER_USER
    rank: int = Field(default=0, description="The rank whose parent produced this result.")
    backend: str | None = None
    initialised: bool = Field(
        default=True,
        description="The script initialised torch.distributed (else the ranks "
        "ran independently and could not be compared).",
    )
    allreduce_counting: Literal["comm-hook", "user-hook", "builtin-hook", "none"] = "none"
    sharded_parameters: int = 0
    steps: list[RankStep] = Field(default_factory=list)
    first_nonfinite_rank: int | None = None
    first_nonfinite_step: int | None = None
    first_nonfinite_what: str | None = None
    rank_status: dict[int, str] = Field(
        default_factory=dict, description="Final status reported by each rank."
    )
    note: str | None = None
