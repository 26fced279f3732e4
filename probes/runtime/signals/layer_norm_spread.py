"""layer-norm-spread: per-layer gradient norms of the weight layers differ by orders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries, role_of
from gradient_doctor.probes.runtime.signals.stats import weight_layer_medians

RUN = {"weight_layers": ["fc1", "fc2"]}


class LayerNormSpread(Signal):
    id = "layer-norm-spread"
    severities = ("warning", "critical")
    summary = (
        "Median per-layer norms of weight layers of one role (the same layer across depth) "
        "differ by more than layer_spread_warning."
    )
    reads = frozenset({"layer_grad_norms", "weight_layers"})
    optional = frozenset({"layer_roles"})
    thresholds = ("layer_spread_warning", "layer_spread_critical")
    message = (
        "Gradient norms of layers of the same kind differ by {spread:.3g}×: `{high}` "
        "{high_norm:.3g} vs `{low}` {low_norm:.3g} (median over steps; warning above "
        "{warn:g}×, critical above {crit:g}×)."
    )
    advice = (
        "Look at the small layer: saturating activation, missing normalisation, bad init, or a "
        "path with no residual connection."
    )
    per_optimizer = True
    rank = 52
    consults = ("loss-diverging",)
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "layers within 3x",
            None,
            each={"layer_grad_norms": {"fc1": 0.5, "fc2": 0.2}},
            series={"grad_norm": [0.54] * 5},
            run=RUN,
        ),
    ]
    healthy += [
        Example(
            "GradScaler-skipped steps' overflowed layer norms are left out",
            None,
            each={"events": ["scale", "backward", "scaler-step", "scaler-update"]},
            series={
                "layer_grad_norms": [{"fc1": float("inf"), "fc2": 1e-3}] * 5
                + [{"fc1": 0.5, "fc2": 0.2}] * 4,
                "skipped": [True] * 5 + [False] * 4,
                "scale": [2.0 ** (16 - s) for s in range(5)] + [2.0**11] * 4,
                "grad_norm": [float("inf")] * 5 + [0.54] * 4,
            },
            run=RUN,
        ),
        Example(
            "a Transformer's head and attention projection differ by design",
            None,
            each={
                "layer_grad_norms": {
                    "h.0.attn.proj": 1e-3,
                    "h.1.attn.proj": 2e-3,
                    "h.0.mlp.fc": 0.05,
                    "h.1.mlp.fc": 0.04,
                    "lm_head": 0.9,
                }
            },
            series={"grad_norm": [1.0] * 5},
            run={
                "weight_layers": [
                    "h.0.attn.proj",
                    "h.0.mlp.fc",
                    "h.1.attn.proj",
                    "h.1.mlp.fc",
                    "lm_head",
                ]
            },
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "fc2 1000x below fc1",
            "critical",
            each={"layer_grad_norms": {"fc1": 1.0, "fc2": 1e-3}},
            series={"grad_norm": [1.0] * 5},
            run=RUN,
            check={"module": "fc2", "largest_layer": "fc1"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        if ctx.has("loss-diverging"):
            return  # layers thrown apart by a diverging step size: that finding says why
        medians, layers = weight_layer_medians(run)
        roles = run.layer_roles or {layer: role_of(layer) for layer in layers}
        groups: dict[str, list[str]] = {}
        for layer in layers:
            groups.setdefault(roles.get(layer, role_of(layer)), []).append(layer)
        # Layers are compared with the layers of their own role (the same projection at
        # every depth; fc1 with fc2): different roles differ by design.
        worst: tuple[float, str, str] | None = None
        for members in groups.values():
            if len(members) < 2:
                continue
            high = max(members, key=lambda layer: medians[layer])
            low = min(members, key=lambda layer: medians[layer])
            spread = medians[high] / medians[low]
            if worst is None or spread > worst[0]:
                worst = (spread, high, low)
        if worst is None:
            return
        spread, high, low = worst
        warn = ctx.threshold("layer_spread_warning")
        crit = ctx.threshold("layer_spread_critical")
        if spread <= warn:
            return
        yield ctx.finding(
            self.id,
            "critical" if spread > crit else "warning",
            self.message.format(
                spread=spread,
                high=high,
                high_norm=medians[high],
                low=low,
                low_norm=medians[low],
                warn=warn,
                crit=crit,
            ),
            module=low,
            fix=self.advice,
            spread=spread,
            largest_layer=high,
            smallest_layer=low,
            threshold_warning=warn,
            threshold_critical=crit,
        )
