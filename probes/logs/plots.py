"""Pictures of a log: loss, gradient norm, learning rate (and GradScaler scale) over steps.

One figure, one panel per series the log had, sharing the step axis; the first non-finite step
is a red vertical line on every panel and the isolated spikes of the norm and the loss are red
dots (the spike signal's rule, :func:`probes.runtime.plots.spike_steps`, on the kept series,
which holds every spike's neighbourhood exactly). Drawn headless with matplotlib's object API
and the Agg canvas, like the probe's pictures; matplotlib is imported only when a picture is
drawn.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gradient_doctor.probes.logs.report import LogReport
from gradient_doctor.probes.runtime.plots import spike_steps

if TYPE_CHECKING:
    from matplotlib.axes import Axes

DPI = 110
DEFAULT_SPIKE_FACTOR = 10.0
#: Panels, in order: (series column, y label, log scale).
PANELS = (
    ("loss", "loss", False),
    ("grad_norm_before_clip", "grad norm (before clip)", True),
    ("grad_norm", "grad norm", True),
    ("lr", "learning rate", False),
    ("scale", "GradScaler scale", True),
)


def _spike_factor(profile: str) -> float:
    try:
        from gradient_doctor.probes.runtime.diagnose import resolve_profile

        return float(resolve_profile(profile).spike_factor.value)
    except Exception:  # the picture must not fail because the profile is unknown
        return DEFAULT_SPIKE_FACTOR


def _finite_points(steps: list[int], values: list[float | None]) -> tuple[list[int], list[float]]:
    xs: list[int] = []
    ys: list[float] = []
    for step, value in zip(steps, values, strict=False):
        if value is not None and math.isfinite(value):
            xs.append(step)
            ys.append(value)
    return xs, ys


def _mark_spikes(axes: Axes, xs: list[int], ys: list[float], factor: float) -> int:
    spikes = set(spike_steps(xs, ys, factor))
    if not spikes:
        return 0
    points = [(x, y) for x, y in zip(xs, ys, strict=False) if x in spikes]
    axes.scatter(
        [x for x, _ in points],
        [y for _, y in points],
        color="#d62728",
        s=18,
        zorder=3,
        label=f"isolated spike (> {factor:g}× running median)",
    )
    return len(points)


def series_png(report: LogReport) -> bytes | None:
    """The figure of ``report``'s kept series (None when it has no series to draw)."""
    columns = report.series or {}
    steps = [int(s) for s in columns.get("step", []) if s is not None]
    panels = [p for p in PANELS if any(v is not None for v in columns.get(p[0], []))]
    if not steps or not panels:
        return None
    if "grad_norm_before_clip" in [p[0] for p in panels]:
        panels = [p for p in panels if p[0] != "grad_norm"]  # the raw norm is the one to see
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 2.0 + 1.7 * len(panels)), dpi=DPI, layout="constrained")
    axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    factor = _spike_factor(report.profile)
    bad_step = report.counts.first_nonfinite_step
    for axes, (column, label, log_scale) in zip(axes_list, panels, strict=True):
        values = [None if v is None else float(v) for v in columns.get(column, [])]
        xs, ys = _finite_points(steps, values)
        style = {"linewidth": 0.9, "marker": "." if len(xs) < 60 else None, "markersize": 3}
        axes.plot(xs, ys, color="#1f77b4", **style)
        wide = bool(ys) and min(ys) > 0 and max(ys) > 1e3 * min(ys)  # e.g. a diverging loss
        if (log_scale or wide) and ys and min(ys) > 0:
            axes.set_yscale("log")
        if column in ("loss", "grad_norm", "grad_norm_before_clip"):
            _mark_spikes(axes, xs, ys, factor)
        if bad_step is not None:
            axes.axvline(
                bad_step,
                color="#d62728",
                linestyle="--",
                linewidth=1.0,
                label=f"first non-finite ({report.counts.first_nonfinite_field}) "
                f"at step {bad_step}",
            )
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize=7)
    axes_list[-1].set_xlabel(
        "step" if report.step_numbers == "logged" else "logged record (no step numbers in the log)"
    )
    thinned = f", 1 in {report.sample_stride} between anomalies" if report.sample_stride > 1 else ""
    figure.suptitle(
        f"{Path(report.path).name} ({report.format}): {report.steps_read} steps read, "
        f"{report.kept_steps} drawn{thinned}",
        fontsize=9,
    )
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


def plot_pngs(report: LogReport) -> list[tuple[str, bytes]]:
    """``[(file name, PNG bytes)]`` for ``report`` (empty when there is nothing to draw)."""
    png = series_png(report)
    if png is None:
        return []
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(report.path).name) or "log"
    return [(f"{stem}-series.png", png)]


def write_plots(report: LogReport, directory: str | Path) -> list[Path]:
    """Write ``report``'s pictures into ``directory``; the paths written."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in plot_pngs(report):
        target = folder / name
        target.write_bytes(png)
        written.append(target)
    return written
