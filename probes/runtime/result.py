"""Typed results of the runtime probe (parent side; never imports torch).

The child process sends raw measurements (:class:`StepRecord`, :class:`ChildSummary`) over the
side channel; the parent validates them, diagnoses them (``probes.runtime.diagnose``) and returns
one :class:`ProbeResult`. The per-step series stay in the result so plots can be drawn from it.

Non-finite numbers are part of the story (a NaN norm names the tensor that went bad), so every
model here serialises NaN and Inf as the JSON strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
and reads them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.rank_models import DistributedInfo

ProbeStatus = Literal[
    "ok", "stopped", "script-error", "timeout", "no-training-loop", "out-of-memory"
]
#: Statuses for which measurements were taken as planned.
SUCCESS_STATUSES: frozenset[str] = frozenset({"ok", "stopped"})

EventName = Literal[
    "backward",
    "scale",
    "unscale",
    "clip",
    "clip-value",
    "step",
    "scaler-step",
    "scaler-update",
    "zero-grad",
    "scheduler",
    "forward-ddp-sync",
    "forward-ddp-no-sync",
]


class _Series(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class TensorDetail(_Series):
    """The richer statistics of one parameter's gradient, gathered on sampled steps."""

    max_abs: float
    mean: float
    std: float
    zeros: int
    nans: int
    infs: int
    numel: int
    param_norm: float
    ratio: float = Field(description="‖g‖/‖w‖ of this tensor (inf when ‖w‖ is 0).")


class NanOrigin(_Series):
    """Where the first non-finite value was seen (sampled or armed steps only)."""

    step: int
    phase: Literal["input", "parameters", "forward", "loss", "backward", "unknown"]
    module: str | None = None
    detail: str


class StepRecord(_Series):
    """Raw measurements of one optimizer step, as sent by the child."""

    step: int = Field(description="1-based optimizer step (GradScaler-skipped steps count).")
    optimizer: int = Field(default=0, description="Index of the optimizer that stepped.")
    grad_norms: list[float | None] = Field(
        description="Per-parameter L2 gradient norm as applied by the step (after any "
        "clipping), aligned with ProbeResult.parameters; None where the gradient is None. "
        "Unscaled: divided by the GradScaler scale the gradients still carried, if any."
    )
    total_norm: float = Field(
        description="Total L2 norm of the gradients the step applied (unscaled)."
    )
    total_norm_before_clip: float | None = Field(
        default=None,
        description="Total norm returned by the script's clip_grad_norm_ call, unscaled "
        "(a clip before scaler.unscale_ saw scale× this).",
    )
    clip_max_norm: float | None = None
    clip_value: float | None = None
    clipped: bool | None = Field(default=None, description="Norm clipping changed gradients.")
    losses: list[float | None] = Field(
        default_factory=list, description="Loss given to each backward() of the step."
    )
    loss_ops: list[str] = Field(
        default_factory=list, description="autograd node that produced each backward's loss."
    )
    events: list[EventName] = Field(default_factory=list)
    lr: float | None = None
    scale: float | None = Field(default=None, description="GradScaler scale during the step.")
    skipped: bool = Field(default=False, description="GradScaler skipped optimizer.step().")
    grad_reused: bool | None = Field(
        default=None, description="The first gradient tensor is the same object as last step."
    )
    sampled: bool = False
    detail: list[TensorDetail | None] | None = None
    dead_units: dict[str, list[int]] | None = Field(
        default=None, description="ReLU-family module → [never-firing units, units]."
    )
    nonfinite_params: list[str] | None = Field(
        default=None, description="Parameters already non-finite before this step's update."
    )
    inputs_finite: bool | None = Field(
        default=None,
        description="Every fresh floating-point input given to the model's forward in the step "
        "was finite (None: no such input).",
    )
    grad_carried: bool | None = Field(
        default=None,
        description="The optimizer's gradients were still non-zero from its previous update "
        "when the step's first backward() began (no zero_grad in between).",
    )
    batches: int | None = Field(
        default=None, description="DataLoader batches drawn in the step (None: no DataLoader)."
    )
    feeds: int | None = Field(
        default=None,
        description="Forwards of the stepped model that took a fresh input in the step.",
    )
    closure_evals: int = Field(
        default=0, description="Extra closure evaluations inside the step (LBFGS line search)."
    )
    update_norms: list[float | None] | None = Field(
        default=None,
        description="Per-parameter ‖Δw‖ of the applied update (estimated from up to 4096 "
        "strided elements), on sampled steps.",
    )
    overhead_s: float = Field(default=0.0, description="Time spent in the probe this step.")


class ChildSummary(_Series):
    """The child's last message: how the script ended and what it saw overall."""

    status: ProbeStatus
    message: str | None = None
    traceback_tail: str | None = None
    input_error: bool = Field(default=False, description="The probe's input was bad.")
    device: str = "cpu"
    torch_version: str = "unknown"
    parameters: list[str]
    shapes: list[list[int]]
    layers: list[str] = Field(description="Owning module of each parameter, same order.")
    layer_types: dict[str, str] = Field(default_factory=dict, description="Layer → class name.")
    optimizers: int = 0
    optimizer_kinds: list[str] = Field(
        default_factory=list,
        description="Class name of each optimizer by index; 'manual' for a hand-written update.",
    )
    optimizer_names: list[str | None] = Field(
        default_factory=list,
        description="The script's own name of each optimizer by index (None: not sure).",
    )
    backward_calls: int = 0
    saturating_modules: int = 0
    relu_modules: int = 0
    ddp: bool = False
    nan_origin: NanOrigin | None = None
    events_total: dict[str, int] = Field(default_factory=dict)
    double_unscale: int = 0
    script_s: float = 0.0
    probe_s: float = 0.0


class InterpreterInfo(_Series):
    """The interpreter that ran the script and why it was chosen."""

    path: str
    source: Literal["option", "project-venv", "virtual-env", "conda", "tool"]
    reason: str = Field(description="Why this interpreter: --python, a .venv found, ...")
    python_version: str | None = Field(default=None, description="As the child reported it.")


class IsolationInfo(_Series):
    """What the probe's supervisor saw around the script's process
    (``probes.runtime.supervisor``)."""

    working_dir: str = Field(description="The script's working folder.")
    max_memory: int | None = Field(default=None, description="Address-space cap, bytes.")
    scrubbed_env: list[str] = Field(
        default_factory=list, description="Server secrets kept out of the script's environment."
    )
    parent_signals: list[str] = Field(
        default_factory=list,
        description="Signals sent to the script's parent process (ignored there).",
    )
    parent_killed: str | None = Field(
        default=None, description="Signal that killed the script's parent (the run ended)."
    )
    left_behind: list[str] = Field(
        default_factory=list,
        description="Processes the script left running (daemons, double forks), stopped.",
    )


class SeedCall(_Series):
    """One call the script made to a global seeding function."""

    function: str = Field(description="torch.manual_seed, random.seed or numpy.random.seed.")
    seed: str = Field(description="The value it passed (repr, shortened).")
    where: str | None = Field(default=None, description="file:line of the call.")


class SeedingInfo(_Series):
    """How a seeded run (``check --verify``) was seeded, and what it started from."""

    seed: int | None = Field(default=None, description="The seed given before the script ran.")
    seeded: list[str] = Field(
        default_factory=list, description="Generators seeded: random, torch, numpy."
    )
    reseeds: list[SeedCall] = Field(
        default_factory=list, description="The script's own seeding calls (the first few)."
    )
    reseed_count: int = 0
    start_fingerprint: list[float] | None = Field(
        default=None,
        description="Sums of the starting weights and the first batch, read at the first "
        "forward call of a module with parameters (two runs that start alike match).",
    )
    start_module: str | None = Field(
        default=None, description="Class of the module whose first forward was read."
    )
    threads: int | None = Field(default=None, description="torch's intra-op threads.")


class LayerSeries(_Series):
    """Per-layer gradient norms (L2 over the layer's own parameters), one value per step."""

    layer: str
    norms: list[float | None]


class ProbeResult(_Series):
    """Everything the runtime probe found: status, findings, and the measured series."""

    status: ProbeStatus
    message: str | None = Field(default=None, description="One line for non-ok statuses.")
    traceback_tail: str | None = None
    script: str
    args: list[str] = Field(default_factory=list)
    steps: int = Field(description="Optimizer steps measured.")
    steps_requested: int
    sample_every: int
    device: str = "unknown"
    profile: str = Field(description="Threshold profile the diagnosis used.")
    findings: list[Finding] = Field(default_factory=list)
    parameters: list[str] = Field(default_factory=list)
    layers: list[str] = Field(default_factory=list, description="Owning module per parameter.")
    layer_names: list[str] = Field(default_factory=list, description="Distinct layers, in order.")
    records: list[StepRecord] = Field(default_factory=list, description="Raw per-step series.")
    total_norm: list[float] = Field(default_factory=list, description="Per step, as applied.")
    total_norm_before_clip: list[float | None] = Field(default_factory=list)
    loss: list[float | None] = Field(
        default_factory=list, description="Per step: mean of the losses given to backward()."
    )
    layer_norms: list[LayerSeries] = Field(default_factory=list)
    optimizer_kinds: list[str] = Field(
        default_factory=list,
        description="Class name of each optimizer (records' `optimizer` indexes it); 'manual' "
        "for a hand-written update.",
    )
    optimizer_names: list[str | None] = Field(
        default_factory=list,
        description="The script's own variable name of each optimizer (`optimizerG`), read "
        "from its first step; None where the probe could not tell.",
    )
    nan_origin: NanOrigin | None = None
    wall_s: float = 0.0
    script_s: float = 0.0
    probe_s: float = Field(default=0.0, description="Time spent inside the probe's hooks.")
    torch_version: str | None = None
    interpreter: InterpreterInfo | None = Field(
        default=None, description="The interpreter that ran the script, and why."
    )
    isolation: IsolationInfo | None = None
    distributed: DistributedInfo | None = Field(
        default=None,
        description="Rank series and merge details when the script ran under "
        "torchrun (probe --nproc, or launched by the user); None for one process.",
    )
    seeding: SeedingInfo | None = Field(
        default=None, description="Seeds and start fingerprint of a seeded run (--verify)."
    )
    patched: bool = Field(
        default=False, description="A patched text ran in place of the script's own (--verify)."
    )

    @property
    def ok(self) -> bool:
        """True when the probe measured the run as planned (status ok or stopped)."""
        return self.status in SUCCESS_STATUSES


def optimizer_label(
    index: int, kinds: Sequence[str] | None, names: Sequence[str | None] | None
) -> str:
    """How reports, findings and plots name one optimizer: ```optimizerG` (Adam)`` when the
    script's own name is known and no other optimizer has it, else ``optimizer 1 (Adam)``."""
    kinds, names = kinds or [], names or []
    kind = kinds[index] if index < len(kinds) else None
    name = names[index] if index < len(names) else None
    unique = bool(name) and list(names).count(name) == 1
    label = f"`{name}`" if unique else f"optimizer {index}"
    return label + (f" ({kind})" if kind else "")
