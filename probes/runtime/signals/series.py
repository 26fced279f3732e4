"""The input of the runtime signals: one training run as step series (never imports torch).

Two producers fill it:

- the runtime probe (:meth:`RunSeries.from_probe`), which measures everything it can: each
  backward's loss, per-parameter gradient norms, the order of calls, sampled statistics;
- a training log read after the fact (console, JSONL, CSV, TensorBoard), which usually gives a
  few columns only: the loss, the total gradient norm, the learning rate, maybe the GradScaler
  scale or per-layer norms, at step numbers that need not be contiguous.

Every per-step field of :class:`StepPoint` except ``step`` is optional, and a signal states the
fields it reads (``Signal.reads``); :meth:`RunSeries.available` says which fields this run has,
and a signal whose fields are missing is skipped, not run on guesses. A log producer builds the
series directly::

    run = RunSeries(
        source="log",
        steps=[StepPoint(step=s, loss=l, grad_norm=g, lr=lr) for s, l, g, lr in rows],
    )
    findings = run_signals(run, profile)      # probes.runtime.signals
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradient_doctor.probes.runtime.result import ChildSummary, NanOrigin, StepRecord


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class StepPoint(_Model):
    """What is known about one optimizer step. ``None`` everywhere means "not measured"."""

    step: int = Field(description="Step number as the source counts it (gaps allowed).")
    optimizer: int = Field(default=0, description="Which optimizer stepped (0 for a log).")
    loss: float | None = Field(
        default=None, description="The step's loss (the mean of its backward() losses)."
    )
    losses: list[float | None] | None = Field(
        default=None, description="Each backward()'s loss in the step (probe only)."
    )
    grad_norm: float | None = Field(
        default=None, description="Total L2 norm of the gradients the update applied."
    )
    grad_norm_before_clip: float | None = Field(
        default=None, description="Total norm the script's clip saw (before clipping)."
    )
    clip_max_norm: float | None = None
    clip_value: float | None = None
    clipped: bool | None = Field(default=None, description="Norm clipping changed gradients.")
    lr: float | None = Field(default=None, description="Learning rate used by the step.")
    scale: float | None = Field(default=None, description="GradScaler scale during the step.")
    skipped: bool | None = Field(default=None, description="GradScaler skipped the update.")
    events: list[str] | None = Field(
        default=None, description="Training calls since the previous step, in order (probe)."
    )
    loss_ops: list[str] | None = Field(
        default=None, description="autograd node that produced each backward()'s loss."
    )
    grad_reused: bool | None = Field(
        default=None, description="The gradient tensors are the same objects as last step."
    )
    layer_grad_norms: dict[str, float] | None = Field(
        default=None, description="Per-layer gradient norm (L2 over the layer's parameters)."
    )
    param_grad_norms: list[float | None] | None = Field(
        default=None, description="Per-parameter gradient norm, aligned with run.parameters."
    )
    param_norms: list[float | None] | None = Field(
        default=None, description="Per-parameter weight norm on sampled steps."
    )
    dead_units: dict[str, tuple[int, int]] | None = Field(
        default=None, description="Activation site → (never-firing units, units)."
    )
    nonfinite_params: list[str] | None = Field(
        default=None, description="Parameters already non-finite before the step's forward."
    )
    inputs_finite: bool | None = Field(
        default=None, description="The fresh inputs given to the model's forward were finite."
    )
    grad_carried: bool | None = Field(
        default=None, description="Gradients were still non-zero from the previous update."
    )
    batches: int | None = Field(default=None, description="DataLoader batches drawn.")
    feeds: int | None = Field(
        default=None, description="Forwards of the stepped model that took fresh inputs."
    )
    update_ratios: dict[str, float] | None = Field(
        default=None, description="Per weight layer ‖Δw‖/‖w‖ of the applied update (sampled)."
    )


#: Fields a signal may read: every StepPoint field plus the run-level ones below.
RUN_FIELDS = frozenset(
    {
        "parameters",
        "param_layers",
        "weight_layers",
        "ddp",
        "saturating_modules",
        "double_unscale",
        "nan_origin",
        "optimizer_kinds",
        "zero_gain_layers",
        "layer_roles",
    }
)


class RunSeries(_Model):
    """One run's steps (sorted by step) and what is known about the run as a whole."""

    source: Literal["probe", "log"] = "log"
    status: str | None = Field(default=None, description="How the run ended (probe status).")
    steps: list[StepPoint] = Field(default_factory=list)
    parameters: list[str] | None = Field(
        default=None, description="Parameter names, the order of param_grad_norms."
    )
    param_layers: list[str] | None = Field(
        default=None, description="Owning layer of each parameter."
    )
    weight_layers: list[str] | None = Field(
        default=None,
        description="Layers whose gradient norms are comparable (own a 2-D+ weight, not an "
        "embedding), in model order.",
    )
    ddp: bool | None = None
    saturating_modules: int | None = Field(
        default=None, description="Sigmoid/tanh modules called in one forward pass."
    )
    double_unscale: int | None = Field(
        default=None, description="RuntimeErrors from a second GradScaler.unscale_ call."
    )
    nan_origin: NanOrigin | None = None
    optimizer_kinds: list[str] | None = Field(
        default=None, description="Optimizer class per index ('manual': a hand-written update)."
    )
    optimizer_names: list[str | None] | None = Field(
        default=None, description="The script's own name of each optimizer (None: not sure)."
    )
    layer_roles: dict[str, str] | None = Field(
        default=None,
        description="Weight layer → its role: class name and name without indices "
        "(`Linear:blocks..attn.proj`). Layers of one role repeat across depth; only they are "
        "compared for spread (a vocabulary head and an attention projection differ by design).",
    )
    zero_gain_layers: list[str] | None = Field(
        default=None,
        description="Weight layers whose gradient is gated by a gain initialised at zero "
        "(a zero-init BatchNorm/LayerNorm scale after them): small by design at first.",
    )

    # -- what is there ---------------------------------------------------------------------
    def available(self) -> frozenset[str]:
        """The fields this run has: per-step fields set on at least one step, run fields set."""
        present = {name for name in RUN_FIELDS if getattr(self, name) is not None}
        for point in self.steps:
            for name, value in point:
                if value is not None:
                    present.add(name)
        return frozenset(present)

    def has(self, *fields: str) -> bool:
        """True when every one of ``fields`` is available."""
        return set(fields) <= self.available()

    def optimizers(self) -> list[int]:
        """The optimizer indices that stepped, in order of first appearance."""
        seen: list[int] = []
        for point in self.steps:
            if point.optimizer not in seen:
                seen.append(point.optimizer)
        return seen

    def for_optimizer(self, index: int) -> RunSeries:
        """The steps of optimizer ``index`` only."""
        return self.model_copy(update={"steps": [p for p in self.steps if p.optimizer == index]})

    def up_to(self, step: int | None) -> RunSeries:
        """This run restricted to the steps before ``step`` (all of them when None)."""
        if step is None:
            return self
        return self.model_copy(update={"steps": [p for p in self.steps if p.step < step]})

    # -- from the probe --------------------------------------------------------------------
    @classmethod
    def from_probe(cls, records: list[StepRecord], summary: ChildSummary) -> RunSeries:
        """The series the probe measured (``records`` sorted by step)."""
        gated = _zero_gain_layers(records, summary)
        weight_layers = _weight_layers(summary)
        return cls(
            source="probe",
            status=summary.status,
            steps=[_point(record, summary.layers, weight_layers) for record in records],
            parameters=list(summary.parameters),
            param_layers=list(summary.layers),
            weight_layers=[layer for layer in weight_layers if layer not in gated],
            zero_gain_layers=gated,
            layer_roles={
                layer: role_of(layer, summary.layer_types.get(layer, "")) for layer in weight_layers
            },
            optimizer_kinds=list(summary.optimizer_kinds) or None,
            optimizer_names=list(summary.optimizer_names) or None,
            ddp=summary.ddp,
            saturating_modules=summary.saturating_modules,
            double_unscale=summary.double_unscale,
            nan_origin=summary.nan_origin,
        )


def role_of(layer: str, kind: str = "") -> str:
    """A layer's role: its class and its name with the indices removed (``h.3.mlp.c_fc`` and
    ``h.5.mlp.c_fc`` share one; ``fc1`` and ``fc2`` too)."""
    return f"{kind}:{re.sub(r'[0-9]+', '', layer)}"


def _layer_norms(layers: list[str], norms: list[float | None]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for layer, norm in zip(layers, norms, strict=False):
        if norm is None:
            continue
        sums[layer] = sums.get(layer, 0.0) + norm * norm
    return {layer: math.sqrt(total) for layer, total in sums.items()}


def _step_loss(losses: list[float | None]) -> float | None:
    present = [v for v in losses if v is not None]
    return sum(present) / len(present) if present else None


def _update_ratios(
    record: StepRecord, layers: list[str], weight_layers: list[str]
) -> dict[str, float] | None:
    """‖Δw‖/‖w‖ per weight layer (L2 over its parameters; ‖w‖ before the update)."""
    if record.update_norms is None or record.detail is None:
        return None
    updates: dict[str, float] = {}
    weights: dict[str, float] = {}
    for layer, update, detail in zip(layers, record.update_norms, record.detail, strict=False):
        if update is None or detail is None:
            continue
        updates[layer] = updates.get(layer, 0.0) + update * update
        weights[layer] = weights.get(layer, 0.0) + detail.param_norm**2
    ratios = {
        layer: math.sqrt(updates[layer]) / math.sqrt(weights[layer])
        for layer in weight_layers
        if weights.get(layer, 0.0) > 0 and layer in updates
    }
    return ratios or None


def _point(record: StepRecord, layers: list[str], weight_layers: list[str]) -> StepPoint:
    values: dict[str, Any] = {
        "step": record.step,
        "optimizer": record.optimizer,
        "loss": _step_loss(record.losses),
        "losses": list(record.losses),
        "grad_norm": record.total_norm,
        "grad_norm_before_clip": record.total_norm_before_clip,
        "clip_max_norm": record.clip_max_norm,
        "clip_value": record.clip_value,
        "clipped": record.clipped,
        "lr": record.lr,
        "scale": record.scale,
        "skipped": record.skipped,
        "events": list(record.events),
        "loss_ops": list(record.loss_ops),
        "grad_reused": record.grad_reused,
        "layer_grad_norms": _layer_norms(layers, record.grad_norms),
        "param_grad_norms": list(record.grad_norms),
        "nonfinite_params": record.nonfinite_params,
        "inputs_finite": record.inputs_finite,
        "grad_carried": record.grad_carried,
        "batches": record.batches,
        "feeds": record.feeds,
        "update_ratios": _update_ratios(record, layers, weight_layers),
    }
    if record.detail is not None:
        values["param_norms"] = [None if d is None else d.param_norm for d in record.detail]
    if record.dead_units is not None:
        values["dead_units"] = {k: (v[0], v[1]) for k, v in record.dead_units.items()}
    return StepPoint.model_validate(values)


def _weight_layers(summary: ChildSummary) -> list[str]:
    """Layers whose gradient norms are comparable: they own a parameter of two or more
    dimensions (not norm layers), and are not embeddings (whose gradient only touches the rows
    of the tokens in the batch, so it is small by construction)."""
    seen: list[str] = []
    for layer, shape in zip(summary.layers, summary.shapes, strict=False):
        kind = summary.layer_types.get(layer, "")
        if len(shape) >= 2 and layer not in seen and not kind.startswith("Embedding"):
            seen.append(layer)
    return seen


def _zero_gain_layers(records: list[StepRecord], summary: ChildSummary) -> list[str]:
    """Weight layers followed (in parameter order) by a normalisation scale that was exactly
    zero on the first sampled step: a zero-initialised residual gain (timm's zero_init_last),
    which keeps the layer's gradient near zero by design until the gain grows."""
    first = next((r for r in records if r.detail), None)
    if first is None or first.detail is None:
        return []
    gated: list[str] = []
    weights_so_far: list[str] = []
    for name, layer, shape, detail in zip(
        summary.parameters, summary.layers, summary.shapes, first.detail, strict=False
    ):
        if len(shape) >= 2:
            if layer not in weights_so_far:
                weights_so_far.append(layer)
        elif (
            len(shape) == 1
            and name.endswith("weight")
            and detail is not None
            and detail.param_norm == 0.0
            and weights_so_far
        ):
            # The branch the gain closes: the weight layers before it in the same parent
            # module (a residual block), else the one layer right before it.
            parent = layer.rsplit(".", 1)[0] + "." if "." in layer else None
            branch = [w for w in weights_so_far if parent and w.startswith(parent)]
            for weight in branch or weights_so_far[-1:]:
                if weight not in gated:
                    gated.append(weight)
    return gated
