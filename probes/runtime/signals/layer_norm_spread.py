"""layer-norm-spread: per-layer gradient norms of the weight layers differ by orders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import weight_layer_medians

RUN = {"weight_layers": ["fc1", "fc2"]}


class LayerNormSpread(Signal):
    id = "layer-norm-spread"
    severities = ("warning", "critical")
    summary = "Median per-layer norms of weight layers differ by more than layer_spread_warning."
    reads = frozenset({"layer_grad_norms", "weight_layers"})
    thresholds = ("layer_spread_warning", "layer_spread_critical")
    message = (
        "Per-layer gradient norms differ by {spread:.3g}×: `{high}` {high_norm:.3g} vs `{low}` "
        "{low_norm:.3g} (median over steps; warning above {warn:g}×, critical above {crit:g}×)."
    )
    advice = (
        "Look at the small layer: saturating activation, missing normalisation, bad init, or a "
        "path with no residual connection."
    )
    per_optimizer = True
    rank = 52
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
        medians, layers = weight_layer_medians(run)
        if len(layers) < 2:
            return
        high = max(layers, key=lambda layer: medians[layer])
        low = min(layers, key=lambda layer: medians[layer])
        spread = medians[high] / medians[low]
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
