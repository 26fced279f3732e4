"""Parent-side diagnosis: raw step records + a threshold profile → findings (never imports torch).

Every identifier comes from catalog.md (§2 runtime signals and the §1 rows marked R). Numbers
come from the named threshold profile (``knowledge/data/thresholds.yaml``); each finding's
evidence records the profile and the numbers it was judged on.

Order of the non-finite checks (GM, "when clipping doesn't fix NaN"), applied at the first step
where anything was non-finite: parameters that were already non-finite before that step's
forward → ``nan-parameters`` (the non-finite loss is then their consequence, and the earlier
update is the cause); else a non-finite loss given to ``backward()`` →
``nan-loss-before-backward``; else non-finite gradients → ``nan-gradients`` / ``inf-gradients``
with the first parameter and module. Vanishing gradients are reported only while the loss is not
improving: GM calls small gradients with a falling loss healthy.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from gradient_doctor.knowledge.findings import Finding, Fix, Severity, severity_at_least
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.result import ChildSummary, LayerSeries, ProbeResult, StepRecord

#: autograd nodes that mean the loss was divided/multiplied (by 1/N) before backward().
SCALED_LOSS_OPS = frozenset({"DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"})
#: autograd nodes of a raw loss (a reduction or a built-in loss), i.e. not divided by N.
RAW_LOSS_OP = re.compile(r"(Loss|Entropy|Nll|KlDiv|Mean|Sum)\w*Backward\d$")
MIN_TREND_STEPS = 8
SPIKE_WINDOW = 10
SATURATING_DEPTH = 20
#: Relative fall of the loss (first third → last third of the run) that counts as improving.
LOSS_IMPROVING = 0.05


def resolve_profile(name: str | None = None) -> ThresholdProfile:
    """The threshold profile ``name`` (default profile when None) from the knowledge base."""
    from gradient_doctor.knowledge import load_knowledge

    return load_knowledge().thresholds.profile(name)


def _snippet(entry_id: str) -> str | None:
    try:
        from gradient_doctor.knowledge import load_knowledge

        snippets = load_knowledge().get(entry_id).snippets
    except Exception:  # the diagnosis must not fail because the knowledge base is incomplete
        return None
    return snippets[0] if snippets else None


def _finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _num(value: float | None) -> float | str | None:
    """A number for the evidence dict (non-finite values as strings, so JSON stays valid)."""
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.6g}")


def _rank_correlation(values: Sequence[float]) -> float:
    """Spearman correlation of ``values`` with their position (ties broken by order)."""
    n = len(values)
    if n < 3:
        return 0.0
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0] * n
    for rank, i in enumerate(order):
        ranks[i] = rank
    mean = (n - 1) / 2
    cov = sum((i - mean) * (r - mean) for i, r in enumerate(ranks))
    var = sum((i - mean) ** 2 for i in range(n))
    return cov / var if var else 0.0


class _Diagnosis:
    def __init__(
        self, records: list[StepRecord], summary: ChildSummary, profile: ThresholdProfile
    ) -> None:
        self.records = records
        self.summary = summary
        self.profile = profile
        self.findings: list[Finding] = []
        self.parameters = summary.parameters
        self.layers = summary.layers

    # -- helpers ---------------------------------------------------------------------------
    def add(
        self,
        entry_id: str,
        severity: Severity,
        message: str,
        *,
        step: int | None = None,
        parameter: str | None = None,
        module: str | None = None,
        fix: str | None = None,
        **evidence: Any,
    ) -> None:
        evidence["profile"] = self.profile.name
        snippet = _snippet(entry_id)
        self.findings.append(
            Finding(
                id=entry_id,
                severity=severity,
                message=message,
                origin="runtime",
                step=step,
                parameter=parameter,
                module=module,
                evidence=evidence,
                fix=Fix(description=fix, snippet_id=snippet) if fix else None,
            )
        )

    def has(self, entry_id: str) -> bool:
        return any(f.id == entry_id for f in self.findings)

    def raw_norm(self, record: StepRecord) -> float:
        """The norm the script's own backward produced (before its clipping, if any)."""
        before = record.total_norm_before_clip
        return before if before is not None else record.total_norm

    def step_loss(self, record: StepRecord) -> float | None:
        values = _finite(record.losses)
        if not values or len(values) != len([v for v in record.losses if v is not None]):
            return None
        return sum(values) / len(values)

    def loss_improving(self) -> bool | None:
        """True when the loss fell by more than 5 % from the first to the last third."""
        losses = [self.step_loss(r) for r in self.records]
        finite = [v for v in losses if v is not None]
        if len(finite) < 4:
            return None
        third = max(1, len(finite) // 3)
        first = statistics.fmean(finite[:third])
        last = statistics.fmean(finite[-third:])
        return first - last > LOSS_IMPROVING * abs(first) + 1e-12

    def layer_norms(self, record: StepRecord) -> dict[str, float]:
        sums: dict[str, float] = {}
        for layer, norm in zip(self.layers, record.grad_norms, strict=False):
            if norm is None:
                continue
            sums[layer] = sums.get(layer, 0.0) + norm * norm
        return {layer: math.sqrt(total) for layer, total in sums.items()}

    def weight_layers(self) -> list[str]:
        """Layers whose gradient norms are comparable: they own a parameter of two or more
        dimensions (not norm layers), and are not embeddings (whose gradient only touches
        the rows of the tokens in the batch, so it is small by construction)."""
        seen: list[str] = []
        for layer, shape in zip(self.layers, self.summary.shapes, strict=False):
            kind = self.summary.layer_types.get(layer, "")
            if len(shape) >= 2 and layer not in seen and not kind.startswith("Embedding"):
                seen.append(layer)
        return seen

    # -- checks ----------------------------------------------------------------------------
    def run(self) -> list[Finding]:
        self.check_nonfinite()
        self.check_order()
        self.check_accumulation()
        self.check_amp()
        # Norm-based checks read the steps before anything went non-finite (the run up to
        # a NaN is what explains it); after that, norms are meaningless.
        all_records = self.records
        self.records = [r for r in all_records if self.first_bad is None or r.step < self.first_bad]
        if self.records:
            self.check_exploding()
            self.check_vanishing()
            self.check_layers()
            self.check_zero()
            self.check_ratio()
            self.check_trends()
            self.check_dead()
        self.records = all_records
        self.check_clip_activity()
        self.check_saturating()
        if (
            self.summary.status in ("ok", "stopped")
            and self.records
            and not any(severity_at_least(f.severity, "warning") for f in self.findings)
        ):
            norms = _finite(self.raw_norm(r) for r in self.records)
            self.add(
                "healthy",
                "info",
                f"{len(self.records)} steps measured: total gradient norm "
                f"{min(norms):.3g}–{max(norms):.3g} (median {statistics.median(norms):.3g}), "
                "no NaN/Inf, layers balanced, nothing at warning or above.",
                median_norm=_num(statistics.median(norms)),
                min_norm=_num(min(norms)),
                max_norm=_num(max(norms)),
                steps=len(self.records),
            )
        return self.findings

    has_nonfinite = False
    first_bad: int | None = None

    def check_nonfinite(self) -> None:
        for record in self.records:
            loss_bad = any(v is not None and not math.isfinite(v) for v in record.losses)
            grads_bad = not record.skipped and not math.isfinite(record.total_norm)
            if not (loss_bad or grads_bad or record.nonfinite_params):
                continue
            self.has_nonfinite = True
            self.first_bad = record.step
            origin = self.summary.nan_origin
            origin_text = ""
            origin_module = None
            if origin is not None and origin.step == record.step:
                origin_text = f" Origin: {origin.detail}."
                origin_module = origin.module
            elif origin is not None:
                origin_text = f" Traced at step {origin.step}, after it: {origin.detail}."
            if record.nonfinite_params:
                names = record.nonfinite_params
                self.add(
                    "nan-parameters",
                    "critical",
                    f"At step {record.step} the parameters were already non-finite before the "
                    f"forward pass ({', '.join(names[:3])}{'…' if len(names) > 3 else ''}): an "
                    f"earlier update broke them, the non-finite loss is a consequence."
                    + origin_text,
                    step=record.step,
                    parameter=names[0],
                    module=names[0].rsplit(".", 1)[0] if "." in names[0] else None,
                    fix="Clip gradients before the step and check the update that preceded it "
                    "(learning rate, optimizer eps, divisions in the update).",
                    nonfinite_parameters=len(names),
                    previous_step_norm=_num(self._norm_at(record.step - 1)),
                )
            elif loss_bad:
                loss = next(v for v in record.losses if v is not None and not math.isfinite(v))
                previous = self._norm_at(record.step - 1)
                if previous is not None and previous > self.profile.exploding_critical.value:
                    cause = (
                        f"the previous step's gradient norm was {previous:.3g}, so the weights "
                        "grew until the loss overflowed: fix the explosion first"
                    )
                else:
                    cause = (
                        "the loss computation is the problem, not the gradients; clipping "
                        "cannot fix it"
                    )
                self.add(
                    "nan-loss-before-backward",
                    "critical",
                    f"The loss given to backward() at step {record.step} was already "
                    f"{_num(loss)}: {cause}." + origin_text,
                    step=record.step,
                    module=origin_module,
                    fix="Make the loss numerically safe (epsilon in log/division, clamp, "
                    "a fused built-in such as cross_entropy) and check that step's batch.",
                    loss=_num(loss),
                    previous_step_norm=_num(previous),
                    origin=origin.model_dump() if origin else None,
                )
            else:
                self._nonfinite_grads(record, origin_text, origin_module)
            return

    def _norm_at(self, step: int) -> float | None:
        for record in self.records:
            if record.step == step:
                return self.raw_norm(record)
        return None

    def _nonfinite_grads(
        self, record: StepRecord, origin_text: str, origin_module: str | None
    ) -> None:
        nan_params = [
            (name, layer)
            for name, layer, norm in zip(
                self.parameters, self.layers, record.grad_norms, strict=False
            )
            if norm is not None and math.isnan(norm)
        ]
        inf_params = [
            (name, layer)
            for name, layer, norm in zip(
                self.parameters, self.layers, record.grad_norms, strict=False
            )
            if norm is not None and math.isinf(norm)
        ]
        finite_losses = _finite(record.losses)
        for entry_id, bad, kind in (
            ("nan-gradients", nan_params, "NaN"),
            ("inf-gradients", inf_params, "Inf"),
        ):
            if not bad:
                continue
            name, layer = bad[0]
            self.add(
                entry_id,
                "critical",
                f"At step {record.step} the gradient of `{name}` (module `{layer}`) holds "
                f"{kind} while the loss was finite"
                + (f" ({finite_losses[0]:.4g})" if finite_losses else "")
                + f"; {len(bad)} of {len(self.parameters)} parameter tensors affected."
                + origin_text,
                step=record.step,
                parameter=name,
                module=origin_module or layer,
                fix="Find the operation whose backward is unbounded (sqrt/log/division at 0, "
                "overflow in low precision) and make it safe; with AMP, unscale before clipping.",
                affected=len(bad),
                first_parameter=name,
                loss=_num(finite_losses[0]) if finite_losses else None,
            )

    def check_exploding(self) -> None:
        norms = [(self.raw_norm(r), r) for r in self.records]
        if self.has("amp-clip-without-unscale"):
            # The clip saw scaled gradients: their norm says nothing about explosion.
            norms = [(r.total_norm, r) for r in self.records]
        peak, peak_record = max(norms, key=lambda item: item[0])
        warn = self.profile.exploding_warning.value
        crit = self.profile.exploding_critical.value
        if peak <= warn:
            return
        above = sum(1 for n, _ in norms if n > warn)
        severity: Severity = "critical" if peak > crit else "warning"
        # A clip outside backward..step changes nothing the optimizer uses.
        clip_misplaced = self.has("clip-after-step") or self.has("clip-before-backward")
        clipped = (
            not clip_misplaced and bool(peak_record.clipped) and peak_record.total_norm <= warn
        )
        if clipped and severity == "critical":
            severity = "warning"
        self.add(
            "exploding-gradients",
            severity,
            f"Total gradient norm reached {peak:.4g} at step {peak_record.step} "
            f"({above} of {len(norms)} steps above {warn:g}; critical above {crit:g})."
            + (" The script's clipping contained it." if clipped else ""),
            step=peak_record.step,
            fix="Clip the total norm after backward() and before the step (max_norm 1.0 for "
            "Transformers, 5–10 for RNNs) and check the learning rate.",
            peak_norm=_num(peak),
            steps_above=above,
            steps=len(norms),
            threshold_warning=warn,
            threshold_critical=crit,
        )

    def check_vanishing(self) -> None:
        improving = self.loss_improving()
        if improving:
            return
        norms = _finite(self.raw_norm(r) for r in self.records)
        median = statistics.median(norms)
        warn = self.profile.vanishing_warning.value
        crit = self.profile.vanishing_critical.value
        ratio, early, late = self._early_late()
        limit = self.profile.early_late_ratio.value
        loss_note = "the loss is not improving" if improving is False else "no loss was seen"
        if median < warn and median > 0:
            severity: Severity = "critical" if median < crit else "warning"
            self.add(
                "vanishing-gradients",
                severity,
                f"Median total gradient norm {median:.3g} is below {warn:g} and {loss_note}.",
                module=early,
                fix="Use non-saturating activations (ReLU/GELU), He/Xavier init, "
                "normalisation layers and residual connections before touching the LR.",
                median_norm=_num(median),
                threshold_warning=warn,
                threshold_critical=crit,
                loss_improving=improving,
            )
        elif ratio is not None and ratio > limit:
            self.add(
                "vanishing-gradients",
                "warning",
                f"The late layer `{late}` gets {ratio:.3g}× the gradient of the early layer "
                f"`{early}` (limit {limit:g}) and {loss_note}.",
                module=early,
                fix="Use non-saturating activations (ReLU/GELU), He/Xavier init, "
                "normalisation layers and residual connections before touching the LR.",
                early_late_ratio=_num(ratio),
                early_layer=early,
                late_layer=late,
                threshold=limit,
                loss_improving=improving,
            )

    def _median_layer_norms(self) -> dict[str, float]:
        per_layer: dict[str, list[float]] = {}
        for record in self.records:
            for layer, norm in self.layer_norms(record).items():
                per_layer.setdefault(layer, []).append(norm)
        return {k: statistics.median(v) for k, v in per_layer.items() if v}

    def _weight_layer_medians(self) -> tuple[dict[str, float], list[str]]:
        """Median norm per layer, and the weight layers (in order) with a non-zero median."""
        medians = self._median_layer_norms()
        layers = [layer for layer in self.weight_layers() if medians.get(layer, 0) > 0]
        return medians, layers

    def _early_late(self) -> tuple[float | None, str | None, str | None]:
        medians, layers = self._weight_layer_medians()
        if len(layers) < 2:
            return None, None, None
        early, late = layers[0], layers[-1]
        return medians[late] / medians[early], early, late

    def check_layers(self) -> None:
        medians, layers = self._weight_layer_medians()
        if len(layers) < 2:
            return
        high = max(layers, key=lambda layer: medians[layer])
        low = min(layers, key=lambda layer: medians[layer])
        spread = medians[high] / medians[low]
        warn = self.profile.layer_spread_warning.value
        crit = self.profile.layer_spread_critical.value
        if spread <= warn:
            return
        self.add(
            "layer-norm-spread",
            "critical" if spread > crit else "warning",
            f"Per-layer gradient norms differ by {spread:.3g}×: `{high}` {medians[high]:.3g} "
            f"vs `{low}` {medians[low]:.3g} (median over steps; warning above {warn:g}×, "
            f"critical above {crit:g}×).",
            module=low,
            fix="Look at the small layer: saturating activation, missing normalisation, bad "
            "init, or a path with no residual connection.",
            spread=_num(spread),
            largest_layer=high,
            smallest_layer=low,
            threshold_warning=warn,
            threshold_critical=crit,
        )

    def check_zero(self) -> None:
        if not self.parameters:
            return
        usable = [r for r in self.records if math.isfinite(r.total_norm)]
        if not usable:
            return
        zero = [
            i
            for i in range(len(self.parameters))
            if all(
                i >= len(r.grad_norms) or r.grad_norms[i] is None or r.grad_norms[i] == 0.0
                for r in usable
            )
        ]
        fraction = len(zero) / len(self.parameters)
        warn = self.profile.zero_grad_fraction_warning.value
        crit = self.profile.zero_grad_fraction_critical.value
        if not zero or fraction <= warn:
            return
        names = [self.parameters[i] for i in zero]
        self.add(
            "zero-gradients",
            "critical" if fraction > crit else "warning",
            f"{len(zero)} of {len(self.parameters)} parameter tensors "
            f"({fraction:.0%}) had an exactly zero (or no) gradient at every step: "
            f"{', '.join(names[:4])}{'…' if len(names) > 4 else ''}.",
            parameter=names[0],
            module=self.layers[zero[0]],
            fix="Check for frozen or disconnected parameters (requires_grad, unused layers, "
            "detach()) and for dead ReLU units.",
            zero_tensors=len(zero),
            tensors=len(self.parameters),
            fraction=_num(fraction),
            threshold_warning=warn,
            threshold_critical=crit,
        )

    def _layer_ratios(self, record: StepRecord) -> dict[str, float]:
        """‖g‖/‖w‖ per weight layer on a sampled step (L2 over the layer's parameters)."""
        assert record.detail is not None
        grads: dict[str, float] = {}
        weights: dict[str, float] = {}
        for layer, detail, norm in zip(self.layers, record.detail, record.grad_norms, strict=False):
            if detail is None or norm is None:
                continue
            grads[layer] = grads.get(layer, 0.0) + norm * norm
            weights[layer] = weights.get(layer, 0.0) + detail.param_norm**2
        ratios = {}
        for layer in self.weight_layers():
            g, w = math.sqrt(grads.get(layer, 0.0)), math.sqrt(weights.get(layer, 0.0))
            if g > 0 and w > 0:
                ratios[layer] = g / w
        return ratios

    def check_ratio(self) -> None:
        sampled = [r for r in self.records if r.detail]
        if not sampled:
            return
        high = self.profile.grad_param_ratio_high.value
        low = self.profile.grad_param_ratio_low.value
        per_step = [self._layer_ratios(r) for r in sampled]
        # A layer is reported when its ratio is out of range on every sampled step: one
        # sample of a small layer at initialisation is not a pattern.
        bad: list[tuple[str, float]] = []
        for layer, ratio in per_step[-1].items():
            history = [ratios.get(layer) for ratios in per_step]
            if all(r is not None and (r > high or r < low) for r in history):
                bad.append((layer, ratio))
        if not bad:
            return
        record = sampled[-1]
        layer, ratio = max(bad, key=lambda item: abs(math.log10(item[1])))
        direction = "too large (updates swamp the weights)" if ratio > high else "too small"
        self.add(
            "grad-param-ratio",
            "warning",
            f"‖g‖/‖w‖ of `{layer}` is {ratio:.3g} at step {record.step} ({direction}), out of "
            f"[{low:g}, {high:g}] on all {len(sampled)} sampled steps; {len(bad)} layer(s) "
            "affected.",
            step=record.step,
            module=layer,
            fix="Too large: lower the learning rate or clip; too small: fix gradient flow "
            "(activations, init, normalisation).",
            ratio=_num(ratio),
            layers_outside=len(bad),
            sampled_steps=len(sampled),
            threshold_high=high,
            threshold_low=low,
        )

    def check_trends(self) -> None:
        norms = [self.raw_norm(r) for r in self.records]
        if len(norms) < MIN_TREND_STEPS:
            self._spikes(norms)
            return
        quarter = max(2, len(norms) // 4)
        first = statistics.median(norms[:quarter])
        last = statistics.median(norms[-quarter:])
        correlation = _rank_correlation(norms)
        if first > 0 and last / first > 10 and correlation > 0.8:
            self.add(
                "grad-norm-rising",
                "warning",
                f"Total gradient norm rose steadily from {first:.3g} to {last:.3g} "
                f"({last / first:.3g}×, rank correlation with step {correlation:.2f}).",
                fix="Add norm clipping before it explodes and check the learning rate.",
                first_median=_num(first),
                last_median=_num(last),
                growth=_num(last / first),
                correlation=_num(correlation),
            )
        elif (
            first > 0
            and last / first < 0.01
            and correlation < -0.8
            and last < 0.1  # towards zero, not merely converging from a large start
        ):
            self.add(
                "grad-norm-decaying",
                "warning",
                f"Total gradient norm decayed from {first:.3g} to {last:.3g} "
                f"({first / last:.3g}× smaller, rank correlation {correlation:.2f}).",
                fix="Check the learning rate schedule and gradient flow (activations, init).",
                first_median=_num(first),
                last_median=_num(last),
                correlation=_num(correlation),
            )
        self._spikes(norms)

    def _spikes(self, norms: list[float]) -> None:
        factor = self.profile.spike_factor.value
        spikes: list[tuple[int, float, float]] = []
        for i in range(5, len(norms) - 1):
            window = norms[max(0, i - SPIKE_WINDOW) : i]
            median = statistics.median(window)
            if median <= 0 or norms[i] <= factor * median:
                continue
            if norms[i + 1] > factor * median:
                continue  # not isolated: a level shift or a rise, not a spike
            spikes.append((i, norms[i], median))
        if not spikes:
            return
        index, value, median = spikes[0]
        step = self.records[index].step
        # Spikes that a correctly placed clip capped are what clipping is for: worth knowing,
        # not a warning.
        misplaced = self.has("clip-after-step") or self.has("clip-before-backward")
        contained = not misplaced and all(self.records[i].clipped for i, _, _ in spikes)
        self.add(
            "grad-norm-spikes",
            "info" if contained else "warning",
            f"{len(spikes)} isolated gradient-norm spike(s); the first at step {step}: "
            f"{value:.3g} against a running median of {median:.3g} ({value / median:.3g}×)."
            + (" The script's clipping capped each of them." if contained else ""),
            step=step,
            fix="Keep the clipping; if spikes are frequent, check the batches of the spike steps."
            if contained
            else "Clip the total norm; check the batch of the spike step for outliers.",
            contained_by_clipping=contained,
            spikes=len(spikes),
            first_spike=_num(value),
            running_median=_num(median),
            factor=factor,
        )

    def check_dead(self) -> None:
        sampled = [r for r in self.records if r.dead_units]
        if not sampled:
            return
        record = sampled[-1]
        assert record.dead_units is not None
        dead = sum(d for d, _ in record.dead_units.values())
        units = sum(u for _, u in record.dead_units.values())
        if units == 0:
            return
        fraction = dead / units
        warn = self.profile.dead_fraction_warning.value
        crit = self.profile.dead_fraction_critical.value
        if fraction <= warn:
            return
        worst = max(record.dead_units.items(), key=lambda kv: kv[1][0] / max(kv[1][1], 1))
        self.add(
            "dead-neurons",
            "critical" if fraction > crit else "warning",
            f"{fraction:.0%} of ReLU units ({dead} of {units}) never fired during step "
            f"{record.step}; worst module `{worst[0]}` ({worst[1][0]} of {worst[1][1]}).",
            step=record.step,
            module=worst[0],
            fix="Use LeakyReLU/GELU, He init, a small positive bias, or a lower learning rate.",
            dead_units=dead,
            units=units,
            fraction=_num(fraction),
            threshold_warning=warn,
            threshold_critical=crit,
        )

    # -- the order of calls --------------------------------------------------------------
    def check_order(self) -> None:
        after: list[int] = []
        before: list[int] = []
        for index, record in enumerate(self.records):
            events = record.events
            if "clip" not in events and "clip-value" not in events:
                continue
            first_backward = events.index("backward") if "backward" in events else len(events)
            for position, event in enumerate(events[:first_backward]):
                if event not in ("clip", "clip-value"):
                    continue
                zeroed = "zero-grad" in events[:position]
                if index > 0 and not zeroed:
                    after.append(record.step)
                else:
                    before.append(record.step)
                break
        if after:
            self.add(
                "clip-after-step",
                "critical",
                f"Clipping ran after optimizer.step() (before the next backward) in "
                f"{len(after)} step(s), first before step {after[0]}: the update had already "
                "used the unclipped gradients.",
                step=after[0],
                fix="Move the clip between backward() and optimizer.step().",
                steps_affected=len(after),
            )
        if before:
            self.add(
                "clip-before-backward",
                "critical",
                f"Clipping ran before backward() in {len(before)} step(s), first in step "
                f"{before[0]}: there were no fresh gradients to clip.",
                step=before[0],
                fix="Move the clip between backward() and optimizer.step().",
                steps_affected=len(before),
            )

    def check_accumulation(self) -> None:
        windows = [r for r in self.records if r.events.count("backward") >= 2]
        if not windows or len(windows) * 2 < len(self.records):
            self._missing_zero_grad(accumulating=False)
            return
        micro = statistics.median(r.events.count("backward") for r in windows)
        ops = [op for r in windows for op in r.loss_ops]
        raw = [op for op in ops if RAW_LOSS_OP.search(op) and op not in SCALED_LOSS_OPS]
        if ops and len(raw) * 2 > len(ops):
            self.add(
                "accum-unscaled-loss",
                "critical",
                f"{micro:g} backward() calls per optimizer step, and the loss reaches "
                f"backward() straight from `{raw[0]}` without a division by the number of "
                f"micro-batches: the accumulated gradient is ~{micro:g}× too large.",
                step=windows[0].step,
                fix=f"Divide each micro-batch loss by the number of micro-batches ({micro:g}) "
                "before backward().",
                backward_per_step=micro,
                loss_op=raw[0],
            )
        zeroing = [
            r.step
            for r in windows
            if "zero-grad" in r.events[r.events.index("backward") + 1 : _last_step_index(r)]
        ]
        if zeroing and len(zeroing) * 2 >= len(windows):
            self.add(
                "accum-zero-grad-every-microstep",
                "critical",
                f"zero_grad() runs between the micro-batches of {len(zeroing)} accumulated "
                f"step(s) (first: step {zeroing[0]}): only the last micro-batch's gradient "
                "reaches the update.",
                step=zeroing[0],
                fix="Zero the gradients only after the optimizer step of each update.",
                steps_affected=len(zeroing),
                backward_per_step=micro,
            )
        clipping = [r.step for r in windows if r.events.count("clip") >= 2]
        clips_per_step = statistics.median(r.events.count("clip") for r in windows)
        if clipping and len(clipping) * 2 >= len(windows):
            self.add(
                "accum-clip-every-microstep",
                "warning",
                f"Gradients were clipped {clips_per_step:g}"
                f" times per accumulated step (first: step {clipping[0]}): each clip sees a "
                "partial gradient.",
                step=clipping[0],
                fix="Clip once, after the last micro-batch's backward() and before the step.",
                steps_affected=len(clipping),
            )
        scheduling = [r.step for r in windows if r.events.count("scheduler") >= 2]
        if scheduling and len(scheduling) * 2 >= len(windows):
            self.add(
                "accum-scheduler-per-microbatch",
                "warning",
                f"The LR scheduler stepped "
                f"{statistics.median(r.events.count('scheduler') for r in windows):g} times per "
                f"optimizer step (first: step {scheduling[0]}): the schedule runs "
                f"{micro:g}× too fast.",
                step=scheduling[0],
                fix="Step the scheduler once per optimizer step, inside the update branch.",
                steps_affected=len(scheduling),
            )
        synced = [r.step for r in windows if r.events.count("forward-ddp-sync") >= 2]
        if self.summary.ddp and synced and len(synced) * 2 >= len(windows):
            self.add(
                "ddp-accum-without-no-sync",
                "warning",
                f"DDP synchronised gradients on every micro-batch of {len(synced)} "
                f"accumulated step(s): {micro:g} all-reduces per update instead of 1.",
                step=synced[0],
                fix="Wrap all but the last micro-batch's forward/backward in model.no_sync().",
                steps_affected=len(synced),
            )
        self._missing_zero_grad(accumulating=True)

    def _missing_zero_grad(self, *, accumulating: bool) -> None:
        later = self.records[1:]
        if len(later) < 2:
            return
        if any("zero-grad" in r.events for r in self.records):
            return
        if not all(r.grad_reused for r in later):
            return
        norms = [self.raw_norm(r) for r in self.records]
        self.add(
            "accum-missing-zero-grad",
            "critical",
            "No zero_grad() ran and the same gradient tensors carried over from update to "
            f"update for {len(later) + 1} steps: gradients keep adding up "
            f"(total norm {norms[0]:.3g} at step 1, {norms[-1]:.3g} at step {len(norms)}).",
            step=later[0].step,
            fix="Call optimizer.zero_grad() after each optimizer step"
            + (" of the update branch." if accumulating else "."),
            first_norm=_num(norms[0]),
            last_norm=_num(norms[-1]),
        )

    def check_amp(self) -> None:
        unscaled_clip: list[int] = []
        bypass: list[int] = []
        double: list[int] = []
        for record in self.records:
            events = record.events
            if "scale" not in events:
                continue
            for position, event in enumerate(events):
                if event == "clip" and "unscale" not in events[:position]:
                    unscaled_clip.append(record.step)
                    break
            for position, event in enumerate(events):
                if event == "step" and (position == 0 or events[position - 1] != "scaler-step"):
                    bypass.append(record.step)
                    break
            if events.count("unscale") >= 2:
                double.append(record.step)
        if unscaled_clip:
            record = next(r for r in self.records if r.step == unscaled_clip[0])
            self.add(
                "amp-clip-without-unscale",
                "critical",
                f"Clipping ran on GradScaler-scaled gradients (no scaler.unscale_ before it) in "
                f"{len(unscaled_clip)} step(s): the clip saw norm "
                f"{_num(record.total_norm_before_clip)} at scale {_num(record.scale)}, so it "
                "clips ~scale× too hard and the real update is tiny.",
                step=unscaled_clip[0],
                fix="Call scaler.unscale_(optimizer) right before clip_grad_norm_.",
                steps_affected=len(unscaled_clip),
                scale=_num(record.scale),
                clip_saw_norm=_num(record.total_norm_before_clip),
            )
        if bypass:
            self.add(
                "amp-step-bypasses-scaler",
                "critical",
                f"optimizer.step() was called directly while a GradScaler scaled the loss "
                f"({len(bypass)} step(s), first: step {bypass[0]}): the update applied "
                "gradients still multiplied by the scale, and overflowed steps are not skipped.",
                step=bypass[0],
                fix="Use scaler.step(optimizer) followed by scaler.update().",
                steps_affected=len(bypass),
            )
        if double or self.summary.double_unscale:
            first = double[0] if double else (len(self.records) + 1)
            self.add(
                "amp-double-unscale",
                "warning",
                f"scaler.unscale_(optimizer) was called twice for one optimizer step (step "
                f"{first}); PyTorch raises a RuntimeError on the second call.",
                step=first,
                fix="Call unscale_ once per optimizer step, right before the clip.",
                occurrences=max(len(double), self.summary.double_unscale),
            )
        scaled = [r for r in self.records if "scale" in r.events and r.scale is not None]
        if len(scaled) >= 4:
            index = 0
            while index < len(scaled) and scaled[index].skipped:
                index += 1  # the scaler calibrates its scale on the first steps
            rest = scaled[index:]
            skipped = [r for r in rest if r.skipped]
            limit = self.profile.amp_skip_fraction.value
            if rest and len(skipped) / len(rest) > limit:
                self.add(
                    "amp-overflow-skips",
                    "warning",
                    f"GradScaler skipped {len(skipped)} of {len(rest)} steps after its initial "
                    f"calibration (limit {limit:.0%}); scale went from {_num(scaled[0].scale)} "
                    f"to {_num(scaled[-1].scale)}.",
                    step=skipped[0].step,
                    fix="Find the overflowing operation (run it in fp32 or use bf16), "
                    "and make sure clipping runs on unscaled gradients.",
                    skipped=len(skipped),
                    steps=len(rest),
                    first_scale=_num(scaled[0].scale),
                    last_scale=_num(scaled[-1].scale),
                    threshold=limit,
                )

    def check_clip_activity(self) -> None:
        clipped = [r for r in self.records if r.clipped is not None]
        # Clip activity says nothing about max_norm when the clip is misplaced or sees scaled
        # gradients: those findings are the ones to fix first.
        misplaced = ("amp-clip-without-unscale", "clip-after-step", "clip-before-backward")
        if len(clipped) < 5 or any(self.has(entry_id) for entry_id in misplaced):
            return
        active = [r for r in clipped if r.clipped]
        fraction = len(active) / len(clipped)
        limit = self.profile.clip_active_fraction.value
        max_norm = clipped[-1].clip_max_norm
        typical = statistics.median(_finite(r.total_norm_before_clip for r in clipped))
        if fraction > limit:
            self.add(
                "clip-too-aggressive",
                "warning",
                f"Clipping at max_norm={max_norm:g} was active on {fraction:.0%} of steps "
                f"(median norm before clipping {typical:.3g}): every update is cut down, "
                "which slows convergence.",
                step=active[0].step,
                fix="Raise max_norm to about the typical norm of healthy steps (1.0 for "
                "Transformers, 5–10 for RNNs).",
                active_fraction=_num(fraction),
                max_norm=max_norm,
                median_norm_before_clip=_num(typical),
                threshold=limit,
            )
        elif not active and self._unstable():
            self.add(
                "clip-never-active",
                "info",
                f"Clipping at max_norm={max_norm:g} never triggered (largest norm "
                f"{max(_finite(r.total_norm_before_clip for r in clipped)):.3g}) while "
                "training was unstable.",
                fix="Lower max_norm towards the norm of healthy steps.",
                max_norm=max_norm,
                median_norm_before_clip=_num(typical),
            )

    def _unstable(self) -> bool:
        if self.has_nonfinite or self.has("grad-norm-spikes"):
            return True
        losses = _finite(self.step_loss(r) for r in self.records)
        if len(losses) < 6:
            return False
        third = len(losses) // 3
        return statistics.fmean(losses[-third:]) > 1.5 * statistics.fmean(losses[:third])

    def check_saturating(self) -> None:
        count = self.summary.saturating_modules
        if count > SATURATING_DEPTH:
            self.add(
                "saturating-deep-net",
                "warning",
                f"One forward pass ran {count} sigmoid/tanh modules (more than "
                f"{SATURATING_DEPTH}): saturating activations this deep shrink gradients "
                "layer after layer.",
                fix="Use ReLU/GELU, residual connections and normalisation in deep stacks.",
                saturating_modules=count,
            )


def _last_step_index(record: StepRecord) -> int:
    events = record.events
    for index in range(len(events) - 1, -1, -1):
        if events[index] in ("step", "scaler-step"):
            return index
    return len(events)


def diagnose(
    records: Sequence[StepRecord], summary: ChildSummary, profile: ThresholdProfile
) -> list[Finding]:
    """Findings for the measured steps, judged with ``profile`` (most severe first)."""
    findings = _Diagnosis(list(records), summary, profile).run()
    rank = {"critical": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: (rank[f.severity], f.step or 0))


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
        nan_origin=summary.nan_origin,
        wall_s=wall_s,
        script_s=summary.script_s,
        probe_s=summary.probe_s,
        torch_version=summary.torch_version,
    )
