"""Pictures of a probe run: gradient flow per layer, total norm over steps, dead units, ranks.

Drawn headless with matplotlib's object API and the Agg canvas (no pyplot, no global backend
state, safe in a server thread) from what a :class:`~probes.runtime.result.ProbeResult` holds:
per-layer norms at every step, the richer per-tensor statistics of sampled steps (max |g|,
element counts), the dead-unit counts of ReLU-family modules, and the rank series of a
distributed run. Import this module only when plots are wanted: matplotlib takes a while to
load, and neither the server nor ``probes.runtime`` imports it on start.

Entry points: :func:`plot_pngs` (``[(file name, PNG bytes)]``, for MCP image content) and
:func:`write_plots` (files in a folder, for ``gradient-doctor probe --plots DIR``).
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from gradient_doctor.probes.runtime.norms import clip_shaped_update, norm_summary, raw_norm
from gradient_doctor.probes.runtime.result import ProbeResult, StepRecord
from gradient_doctor.probes.runtime.result import optimizer_label as _optimizer_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Longest layer label drawn; longer dotted names keep their last parts.
LABEL_CHARS = 34
#: Most layers drawn in one figure (evenly chosen, first and last kept).
MAX_LAYERS = 48
DPI = 110
#: Same rule as the diagnosis (``grad-norm-spikes``): above this many times the running median
#: of the previous SPIKE_WINDOW steps, and back below it on the next step.
SPIKE_WINDOW = 10
DEFAULT_SPIKE_FACTOR = 10.0
FLOOR = 1e-12  # zero on a log axis

BAR_MAX = "#9ecae1"
BAR_RMS = "#08519c"
NORM_RAW = "#9467bd"
NORM_APPLIED = "#1f77b4"
BAD = "#d62728"


def short_layer_name(name: str, limit: int = LABEL_CHARS) -> str:
    """A label that fits: the last dotted parts of ``name``, with ``…`` where parts were cut."""
    if len(name) <= limit:
        return name
    parts = name.split(".")
    kept: list[str] = []
    for part in reversed(parts):
        candidate = ".".join([part, *kept])
        if len(candidate) + 2 > limit and kept:
            break
        kept.insert(0, part)
    label = ".".join(kept)
    if len(label) + 1 > limit:
        return "…" + label[-(limit - 1) :]
    room = limit - len(label) - 2
    cut = parts[len(parts) - len(kept) - 1] if len(kept) < len(parts) else ""
    if room >= 4 and cut:
        # The end of the part that did not fit, which usually still says what the stack is.
        label = cut[-room:] + "." + label
    return "…" + label


def _labels(names: Sequence[str]) -> list[str]:
    """Short labels, made unique again by keeping more of a name where two collide."""
    labels = [short_layer_name(n) for n in names]
    seen: dict[str, int] = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
    return [
        short_layer_name(n, LABEL_CHARS + 14) if seen[label] > 1 else label
        for n, label in zip(names, labels, strict=True)
    ]


def _pick_layers(names: list[str]) -> list[int]:
    if len(names) <= MAX_LAYERS:
        return list(range(len(names)))
    step = (len(names) - 1) / (MAX_LAYERS - 1)
    return sorted({round(i * step) for i in range(MAX_LAYERS)})


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _png(figure: Figure) -> bytes:
    """The picture as PNG bytes. Its title and legend entries also go into the file as text
    (the PNG ``Title`` and ``Description`` chunks), so that a reader that cannot see the
    picture (an assistant, a screen reader) gets what each line is."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    legends = [*figure.legends, *(axes.get_legend() for axes in figure.axes)]
    entries = [text.get_text() for legend in legends if legend is not None for text in legend.texts]
    title = figure.get_suptitle()
    metadata = {"Title": " ".join(title.split()), "Description": "; ".join(entries)}
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white", metadata=metadata)
    return buffer.getvalue()


def _integer_steps(axes: Axes, *, y: bool = False) -> None:
    """Whole optimizer steps (and counts) on the axis: no "2.5" step."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))


def _readable_log_ticks(axes: Axes) -> None:
    """Labels at 1, 2 and 5 × 10^k only: a log axis spanning less than a decade otherwise
    labels every minor tick and the labels run into each other."""
    from matplotlib.ticker import LogLocator, NullFormatter

    axes.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.xaxis.set_minor_formatter(NullFormatter())


def _subtitle(result: ProbeResult) -> str:
    script = Path(result.script).name
    ranks = f", {result.distributed.world_size} ranks" if result.distributed else ""
    return f"{script} · {result.steps} steps{ranks} · profile {result.profile}"


# -- gradient flow ------------------------------------------------------------------------------


def layer_statistics(result: ProbeResult) -> dict[str, tuple[float | None, float | None]]:
    """Per layer: (RMS |g|, max |g|), the median over the sampled steps.

    RMS |g| is the layer's gradient norm over the square root of its element count, the typical
    size of one gradient entry; both need the element counts of sampled steps.
    """
    layer_of = result.layers
    rms: dict[str, list[float]] = {}
    peak: dict[str, list[float]] = {}
    for record in result.records:
        # After a step with NaN/Inf the statistics describe the wreckage, not the flow.
        if not record.detail or not math.isfinite(record.total_norm):
            continue
        sumsq: dict[str, float] = {}
        count: dict[str, int] = {}
        largest: dict[str, float] = {}
        for layer, norm, detail in zip(layer_of, record.grad_norms, record.detail, strict=False):
            if detail is None or norm is None or not math.isfinite(detail.max_abs):
                continue
            sumsq[layer] = sumsq.get(layer, 0.0) + norm * norm
            count[layer] = count.get(layer, 0) + detail.numel
            largest[layer] = max(largest.get(layer, 0.0), detail.max_abs)
        for layer, total in sumsq.items():
            if count[layer] and math.isfinite(total):
                rms.setdefault(layer, []).append(math.sqrt(total / count[layer]))
            if math.isfinite(largest[layer]):
                peak.setdefault(layer, []).append(largest[layer])
    return {
        layer: (
            statistics.median(rms[layer]) if rms.get(layer) else None,
            statistics.median(peak[layer]) if peak.get(layer) else None,
        )
        for layer in result.layer_names
    }


def gradient_flow_png(result: ProbeResult) -> bytes:
    """Bars of RMS and max |g| per layer (log scale) beside a layer × step heat map of norms."""
    from matplotlib.colors import LogNorm

    names = result.layer_names
    chosen = _pick_layers(names)
    shown = [names[i] for i in chosen]
    labels = _labels(shown)
    stats = layer_statistics(result)
    height = min(max(3.6, 0.32 * len(shown) + 1.9), 18.0)
    figure = _figure(12.5, height)
    bars, heat = figure.subplots(1, 2, sharey=True, width_ratios=[1.0, 1.35])
    positions = list(range(len(shown)))

    rms_values = [stats[n][0] for n in shown]
    max_values = [stats[n][1] for n in shown]
    if any(_finite(v) for v in max_values + rms_values):
        bars.barh(
            positions,
            [max(v, FLOOR) if _finite(v) else 0 for v in max_values],
            height=0.8,
            color=BAR_MAX,
            label="max |g|",
        )
        bars.barh(
            positions,
            [max(v, FLOOR) if _finite(v) else 0 for v in rms_values],
            height=0.45,
            color=BAR_RMS,
            label="RMS |g| (typical entry)",
        )
        bars.set_xscale("log")
        figure.legend(loc="outside lower left", ncols=2, fontsize=8, frameon=False)
        sampled = sum(1 for r in result.records if r.detail)
        bars.set_title(f"|g| per layer (median of {sampled} sampled steps)", fontsize=10)
    else:
        norms = _layer_medians(result)
        bars.barh(positions, [max(norms.get(n, 0.0), FLOOR) for n in shown], color=BAR_RMS)
        bars.set_xscale("log")
        bars.set_title("‖g‖ per layer (median over steps)", fontsize=10)
    bars.set_xlabel("gradient magnitude (log scale)")
    _readable_log_ticks(bars)
    bars.set_yticks(positions, labels, fontsize=8)
    bars.invert_yaxis()  # input layers at the top, as in the model
    bars.grid(axis="x", which="major", alpha=0.3)

    series = {s.layer: s.norms for s in result.layer_norms}
    steps = [r.step for r in result.records]
    matrix = [[_cell(series.get(n, []), j) for j in range(len(steps))] for n in shown]
    finite = [v for row in matrix for v in row if math.isfinite(v) and v > 0]
    if finite and steps:
        import numpy as np

        data = np.ma.masked_invalid(np.array(matrix, dtype=float))
        low, high = min(finite), max(finite)
        if high <= low:
            high = low * 10
        cmap = _colormap()
        image = heat.imshow(
            np.ma.masked_less_equal(data, 0),
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            norm=LogNorm(vmin=low, vmax=high),
            extent=(steps[0] - 0.5, steps[-1] + 0.5, len(shown) - 0.5, -0.5),
        )
        colorbar = figure.colorbar(image, ax=heat, shrink=0.9, pad=0.01)
        colorbar.set_label("layer gradient L2 norm ‖g‖ (log)")
        heat.set_xlabel("optimizer step")
        _integer_steps(heat)
        heat.set_title("‖g‖ per layer and step (red: NaN/Inf, white: none)", fontsize=10)
    else:
        heat.text(
            0.5,
            0.5,
            "no per-layer norms measured",
            ha="center",
            va="center",
            transform=heat.transAxes,
        )
    note = f" (showing {len(shown)} of {len(names)} layers)" if len(shown) < len(names) else ""
    figure.suptitle(f"Gradient flow per layer{note}\n{_subtitle(result)}", fontsize=11)
    return _png(figure)


def _colormap() -> object:
    from matplotlib import colormaps

    # Non-finite cells in red, cells without a gradient in white.
    return colormaps["viridis"].with_extremes(bad=BAD, under="white")


def _cell(values: Sequence[float | None], index: int) -> float:
    if index >= len(values) or values[index] is None:
        return 0.0  # no gradient: drawn white (masked as <= 0)
    value = values[index]
    assert value is not None
    return value if math.isfinite(value) else math.nan


def _layer_medians(result: ProbeResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for series in result.layer_norms:
        values = [v for v in series.norms if _finite(v)]
        if values:
            out[series.layer] = statistics.median(values)
    return out


# -- total norm over steps ----------------------------------------------------------------------


def spike_steps(steps: Sequence[int], norms: Sequence[float], factor: float) -> list[int]:
    """Steps whose norm is an isolated spike: above ``factor`` × the running median of the
    previous steps and back below it on the next (the rule of ``grad-norm-spikes``)."""
    found: list[int] = []
    for i in range(5, len(norms) - 1):
        window = [v for v in norms[max(0, i - SPIKE_WINDOW) : i] if math.isfinite(v)]
        if not window:
            continue
        median = statistics.median(window)
        if median <= 0 or not norms[i] > factor * median:
            continue
        if not norms[i + 1] <= factor * median:
            continue  # not back down (a rise, or the run broke): not an isolated spike
        found.append(steps[i])
    return found


def _thresholds(profile_name: str) -> tuple[float | None, float | None, float]:
    """(exploding warning, exploding critical, spike factor) of the profile, when loadable."""
    try:
        from gradient_doctor.knowledge import load_knowledge

        profile = load_knowledge().thresholds.profile(profile_name)
    except Exception:  # pictures must not fail because the knowledge base is incomplete
        return None, None, DEFAULT_SPIKE_FACTOR
    return (
        profile.exploding_warning.value,
        profile.exploding_critical.value,
        profile.spike_factor.value,
    )


def _clip_note(records: Sequence[StepRecord]) -> str:
    """What the plotted norm of these steps is with respect to the script's clip."""
    if any(clip_shaped_update(r) for r in records):
        return " before clipping"
    if any(r.total_norm_before_clip is not None for r in records):
        return " (clip after the step: unclipped)"
    return ""


#: One colour per optimizer when a script has several (a GAN's discriminator and generator).
OPTIMIZER_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def optimizer_label(result: ProbeResult, index: int) -> str:
    """ "optimizerG (Adam)", or "optimizer 1 (Adam)" when the script's name for it is not
    known: how the plots name one optimizer's series (``result.optimizer_label``, without
    the backticks a picture would show as such)."""
    return _optimizer_label(index, result.optimizer_kinds, result.optimizer_names).replace("`", "")


def total_norm_png(result: ProbeResult) -> bytes:
    """Total gradient norm per step (log), the clipping threshold, thresholds, spikes, NaN/Inf.

    With several optimizers each has its own line over its own steps: one optimizer's steps
    are not gaps (or NaN) in another's series."""
    indices = sorted({r.optimizer for r in result.records})
    if len(indices) > 1:
        return _total_norm_per_optimizer_png(result, indices)
    records = result.records
    steps = [r.step for r in records]
    raw = [raw_norm(r) for r in records]
    applied = [r.total_norm for r in records]
    clipped = any(clip_shaped_update(r) for r in records)
    # The script clips, but only after its steps: the update never saw the clip.
    clipped_late = not clipped and any(r.total_norm_before_clip is not None for r in records)
    warn, crit, factor = _thresholds(result.profile)
    figure = _figure(10.5, 5.2)
    axes = figure.subplots()
    finite_raw = [v for v in raw if math.isfinite(v) and v > 0]

    def plot_line(values: list[float], **style: object) -> None:
        axes.plot(steps, [v if math.isfinite(v) and v > 0 else math.nan for v in values], **style)  # type: ignore[arg-type]

    plot_line(
        raw,
        color=NORM_RAW if clipped else NORM_APPLIED,
        marker="o",
        markersize=3,
        linewidth=1.4,
        label="before clipping"
        if clipped
        else "total ‖g‖ (as applied: the clip ran after the step, unclipped)"
        if clipped_late
        else "total ‖g‖",
    )
    if clipped:
        count = norm_summary(records).cut_steps
        plot_line(
            applied,
            color=NORM_APPLIED,
            linewidth=2.2,
            linestyle="--",
            zorder=4,
            label=f"after clipping (applied; {count}/{len(records)} steps clipped)",
        )
    limits = sorted({r.clip_max_norm for r in records if _finite(r.clip_max_norm)})
    for limit in limits:
        late = " (clip after the step: not applied)" if clipped_late else ""
        axes.axhline(limit, color="black", linewidth=1.2, label=f"clip max_norm = {limit:g}{late}")
    top = max(finite_raw, default=1.0)
    bottom = min(finite_raw, default=1.0)
    for value, name, style in ((warn, "warning", ":"), (crit, "critical", "-.")):
        # Draw a threshold only when the curve comes within two decades of it.
        if value is not None and bottom / 10 <= value <= top * 10:
            axes.axhline(
                value,
                color="#ff7f0e",
                linestyle=style,
                linewidth=1.1,
                label=f"exploding {name} > {value:g} ({result.profile})",
            )
    finite_norms = [v if math.isfinite(v) else math.nan for v in raw]
    spikes = spike_steps(steps, finite_norms, factor)
    if spikes:
        at = [raw[steps.index(s)] for s in spikes]
        axes.scatter(
            spikes,
            at,
            s=110,
            facecolors="none",
            edgecolors=BAD,
            linewidths=1.8,
            zorder=5,
            label=f"spike (> {factor:g}× running median)",
        )
    bad = [s for s, v in zip(steps, raw, strict=True) if not math.isfinite(v)]
    for step in bad:
        axes.axvspan(step - 0.5, step + 0.5, color=BAD, alpha=0.15, linewidth=0)
    if bad:
        axes.scatter(
            bad,
            [top] * len(bad),
            marker="x",
            color=BAD,
            s=50,
            zorder=6,
            label=f"NaN/Inf norm (first: step {bad[0]})",
        )
    if finite_raw:
        axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    _integer_steps(axes)
    axes.set_ylabel("total gradient L2 norm ‖g‖ (log scale)")
    axes.grid(alpha=0.3, which="major")
    handles, labels = axes.get_legend_handles_labels()
    twin = _loss_axis(axes, steps, result.loss)
    if twin is not None:
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    # Below the plot, so that it never hides a spike.
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 3),
        fontsize=8,
        frameon=False,
    )
    figure.suptitle(f"Total gradient norm over steps\n{_subtitle(result)}", fontsize=11)
    return _png(figure)


def _total_norm_per_optimizer_png(result: ProbeResult, indices: list[int]) -> bytes:
    warn, crit, factor = _thresholds(result.profile)
    figure = _figure(10.5, 5.2)
    axes = figure.subplots()
    twin = axes.twinx()
    losses_drawn = False
    top = 1.0
    for position, index in enumerate(indices):
        colour = OPTIMIZER_COLOURS[position % len(OPTIMIZER_COLOURS)]
        own = [r for r in result.records if r.optimizer == index]
        steps = [r.step for r in own]
        raw = [raw_norm(r) for r in own]
        label = optimizer_label(result, index)
        axes.plot(
            steps,
            [v if math.isfinite(v) and v > 0 else math.nan for v in raw],
            color=colour,
            marker="o",
            markersize=3,
            linewidth=1.4,
            label=f"{label}: total ‖g‖" + _clip_note(own),
        )
        finite = [v for v in raw if math.isfinite(v) and v > 0]
        top = max([top, *finite])
        spikes = spike_steps(steps, [v if math.isfinite(v) else math.nan for v in raw], factor)
        if spikes:
            axes.scatter(
                spikes,
                [raw[steps.index(s)] for s in spikes],
                s=110,
                facecolors="none",
                edgecolors=BAD,
                linewidths=1.8,
                zorder=5,
            )
        bad = [s for s, v in zip(steps, raw, strict=True) if not math.isfinite(v)]
        if bad:
            axes.scatter(
                bad,
                [top] * len(bad),
                marker="x",
                color=BAD,
                s=50,
                zorder=6,
                label=f"{label}: NaN/Inf norm (first: step {bad[0]})",
            )
        losses = []
        for record in own:
            present = [v for v in record.losses if v is not None and math.isfinite(v)]
            losses.append(sum(present) / len(present) if present else math.nan)
        if any(math.isfinite(v) for v in losses):
            losses_drawn = True
            twin.plot(
                steps,
                losses,
                color=colour,
                linewidth=1.0,
                alpha=0.5,
                linestyle=":",
                label=f"{label}: loss",
            )
    limits = sorted({r.clip_max_norm for r in result.records if _finite(r.clip_max_norm)})
    clipped_late = _clip_note(result.records) == " (clip after the step: unclipped)"
    for limit in limits:
        late = " (clip after the step: not applied)" if clipped_late else ""
        axes.axhline(limit, color="black", linewidth=1.2, label=f"clip max_norm = {limit:g}{late}")
    for value, name, style in ((warn, "warning", ":"), (crit, "critical", "-.")):
        if value is not None and value <= top * 10:
            axes.axhline(
                value,
                color="#ff7f0e",
                linestyle=style,
                linewidth=1.1,
                label=f"exploding {name} > {value:g} ({result.profile})",
            )
    axes.set_yscale("log")
    axes.set_xlabel("optimizer step (all optimizers, in order)")
    _integer_steps(axes)
    axes.set_ylabel("total gradient L2 norm ‖g‖ (log scale)")
    axes.grid(alpha=0.3, which="major")
    handles, labels = axes.get_legend_handles_labels()
    if losses_drawn:
        twin.set_ylabel("loss (per optimizer)", color="#555555")
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    else:
        twin.set_axis_off()
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 3),
        fontsize=8,
        frameon=False,
    )
    figure.suptitle(
        f"Total gradient norm per optimizer ({len(indices)} optimizers)\n{_subtitle(result)}",
        fontsize=11,
    )
    return _png(figure)


def _loss_axis(axes: Axes, steps: list[int], losses: Sequence[float | None]) -> Axes | None:
    values = [v if v is not None and math.isfinite(v) else math.nan for v in losses]
    if not any(math.isfinite(v) for v in values) or len(values) != len(steps):
        return None
    twin = axes.twinx()
    twin.plot(steps, values, color="#7f7f7f", linewidth=1.0, alpha=0.7, label="loss")
    finite = [v for v in values if math.isfinite(v)]
    wide = min(finite) > 0 and max(finite) > 100 * min(finite)
    if wide:
        twin.set_yscale("log")
    twin.set_ylabel("loss (mean per step" + (", log)" if wide else ")"), color="#555555")
    twin.tick_params(axis="y", colors="#555555")
    return twin


# -- dead units ---------------------------------------------------------------------------------


def dead_fractions(result: ProbeResult) -> tuple[int | None, dict[str, tuple[int, int]]]:
    """(step, per ReLU-family module: (never-firing units, units)) of the last sampled step."""
    for record in reversed(result.records):
        if record.dead_units:
            counts = {k: (int(v[0]), int(v[1])) for k, v in record.dead_units.items() if v[1] > 0}
            return record.step, counts
    return None, {}


def dead_units_png(result: ProbeResult) -> bytes | None:
    """Horizontal bars of the dead-unit fraction per ReLU layer (None without ReLU layers)."""
    step, counts = dead_fractions(result)
    if not counts:
        return None
    names = list(counts)
    labels = _labels(names)
    fractions = [counts[n][0] / counts[n][1] for n in names]
    warn, crit = _dead_thresholds(result.profile)
    figure = _figure(9.0, min(max(3.0, 0.38 * len(names) + 1.8), 16.0))
    axes = figure.subplots()
    colors = [BAD if f > crit else "#ff7f0e" if f > warn else "#2ca02c" for f in fractions]
    positions = list(range(len(names)))
    axes.barh(positions, [100 * f for f in fractions], color=colors, height=0.6)
    for y, name in zip(positions, names, strict=True):
        dead, units = counts[name]
        axes.text(min(100 * dead / units + 1.5, 92), y, f"{dead}/{units}", va="center", fontsize=8)
    axes.axvline(100 * warn, color="#ff7f0e", linestyle=":", label=f"warning > {warn:.0%}")
    axes.axvline(100 * crit, color=BAD, linestyle="-.", label=f"critical > {crit:.0%}")
    axes.set_xlim(0, 100)
    axes.set_yticks(positions, labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel(f"units that never fired during sampled step {step} (% of the layer's units)")
    figure.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    axes.grid(axis="x", alpha=0.3)
    figure.suptitle(f"Dead units per ReLU layer\n{_subtitle(result)}", fontsize=11)
    return _png(figure)


def _dead_thresholds(profile_name: str) -> tuple[float, float]:
    try:
        from gradient_doctor.knowledge import load_knowledge

        profile = load_knowledge().thresholds.profile(profile_name)
        return profile.dead_fraction_warning.value, profile.dead_fraction_critical.value
    except Exception:  # the catalogue's numbers (catalog.md §2)
        return 0.2, 0.5


# -- ranks --------------------------------------------------------------------------------------


def ranks_png(result: ProbeResult) -> bytes | None:
    """Per-rank gradient norms per step (and all-reduces per step), for distributed runs."""
    info = result.distributed
    if info is None or not info.steps:
        return None
    steps = [s.step for s in info.steps]
    replicated = any(any(v > 0 for v in s.replicated_norms) for s in info.steps)
    counted = [s.allreduces for s in info.steps]
    has_counts = any(c is not None for c in counted)
    figure = _figure(11.0 if has_counts else 8.0, 4.2)
    panels = figure.subplots(1, 2 if has_counts else 1, squeeze=False)[0]
    axes = panels[0]
    for rank in range(info.world_size):
        values = [
            (s.replicated_norms if replicated else s.rank_norms)[rank]
            if rank < len(s.rank_norms)
            else math.nan
            for s in info.steps
        ]
        axes.plot(
            steps,
            [v if v > 0 and math.isfinite(v) else math.nan for v in values],
            marker="o",
            markersize=3,
            label=f"rank {rank}",
        )
    if not replicated:
        # Shards are different by design; their merged norm is the model's.
        by_step = {r.step: r.total_norm for r in result.records}
        axes.plot(
            steps,
            [by_step.get(s, math.nan) for s in steps],
            color="black",
            linestyle="--",
            linewidth=1.2,
            label="global ‖g‖ (√Σ shards²)",
        )
    diverging = [s.step for s in info.steps if s.diverging_ranks or s.param_diverging_ranks]
    for step in diverging:
        axes.axvspan(step - 0.5, step + 0.5, color=BAD, alpha=0.12, linewidth=0)
    axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    _integer_steps(axes)
    what = "replicated gradient ‖g‖ after sync" if replicated else "local shard ‖g‖"
    axes.set_ylabel(f"{what} (log)")
    if not replicated:
        title = "Per-rank shard gradient norm (sharded: compared as a whole)"
    elif diverging:
        title = "Per-rank gradient norm: ranks disagree (red)"
    else:
        title = "Per-rank gradient norm: ranks agree"
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    if has_counts:
        bars = panels[1]
        bars.bar(steps, [c or 0 for c in counted], color="#6baed6")
        bars.axhline(1, color="black", linestyle=":", label="expected: 1 per step")
        bars.set_xlabel("optimizer step")
        bars.set_ylabel("gradient all-reduces")
        _integer_steps(bars, y=True)
        bars.set_title("All-reduces per optimizer step (DDP hook)", fontsize=10)
        bars.legend(fontsize=8)
    figure.suptitle(f"Ranks\n{_subtitle(result)}", fontsize=11)
    return _png(figure)


# -- entry points -------------------------------------------------------------------------------

PLOTS: tuple[tuple[str, Callable[[ProbeResult], bytes | None]], ...] = (
    ("gradient-flow.png", gradient_flow_png),
    ("total-norm.png", total_norm_png),
    ("dead-units.png", dead_units_png),
    ("ranks.png", ranks_png),
)


def plot_pngs(result: ProbeResult) -> list[tuple[str, bytes]]:
    """Every picture the result supports, as ``(file name, PNG bytes)``; none without steps."""
    if not result.records:
        return []
    pictures: list[tuple[str, bytes]] = []
    for name, draw in PLOTS:
        png = draw(result)
        if png is not None:
            pictures.append((name, png))
    return pictures


def write_plots(result: ProbeResult, directory: str | Path) -> list[Path]:
    """Write the pictures into ``directory`` (created if needed); returns the files written."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, png in plot_pngs(result):
        path = folder / name
        path.write_bytes(png)
        written.append(path)
    return written
