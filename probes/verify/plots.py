"""The before/after picture of a verification: loss and total gradient norm, overlaid.

Left: the loss given to ``backward()`` per step, each run divided by its own value at the first
measured step. Patches such as dividing the loss by the accumulation count change the number
that reaches ``backward()`` by a constant factor; relative to step 1 both runs read alike and
the picture shows what training did. Right: the total gradient norm each step applied, on a log
axis (it may span decades). Non-finite values are marked on the top edge.

matplotlib's object API and the Agg canvas (no pyplot, safe in a server thread); import this
module only when a picture is wanted.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gradient_doctor.probes.verify.model import RunSide, Verification

if TYPE_CHECKING:
    from matplotlib.axes import Axes

FILE_NAME = "verification.png"
DPI = 110
BEFORE = "#d62728"
AFTER = "#1f77b4"
FLOOR = 1e-12  # zero on a log axis


def _relative(values: Sequence[float | None]) -> list[float | None]:
    first = next((v for v in values if v is not None and math.isfinite(v) and v != 0), None)
    if first is None:
        return [None for _ in values]
    return [v / first if v is not None else None for v in values]


def _draw(
    axes: Axes, steps: Sequence[int], values: Sequence[float | None], colour: str, label: str
) -> bool:
    """One line of finite points; non-finite ones as crosses on the top edge. Whether anything
    was drawn."""
    pairs = list(zip(steps, values, strict=False))
    points = [(s, v) for s, v in pairs if v is not None and math.isfinite(v)]
    bad = [s for s, v in pairs if v is not None and not math.isfinite(v)]
    if points:
        axes.plot([p[0] for p in points], [p[1] for p in points], color=colour, lw=1.6, label=label)
    if bad:
        axes.plot(
            bad,
            [1.0] * len(bad),
            "x",
            color=colour,
            transform=axes.get_xaxis_transform(),
            clip_on=False,
            label=f"{label}: NaN/Inf",
        )
    return bool(points or bad)


def _panel(
    axes: Axes,
    before: RunSide,
    after: RunSide | None,
    series: str,
    *,
    title: str,
    log: bool,
) -> None:
    drawn = False
    shown: list[float | None] = []
    for side, colour, label in ((before, BEFORE, "before"), (after, AFTER, "after (patched)")):
        if side is None:
            continue
        values: Sequence[float | None] = getattr(side, series)
        if series == "loss":
            values = _relative(values)
        elif log:
            values = [max(v, FLOOR) if v is not None and math.isfinite(v) else v for v in values]
        drawn = _draw(axes, side.steps_axis, values, colour, label) or drawn
        shown.extend(values)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("optimizer step")
    if drawn and (log or _spans_decades(shown)):
        axes.set_yscale("log")
    if drawn:
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "not measured", ha="center", va="center", transform=axes.transAxes)
    axes.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def _spans_decades(values: Sequence[float | None], decades: float = 3.0) -> bool:
    """Whether the positive values span more than ``decades`` powers of ten (a blow-up to 1e6
    would flatten the rest of a linear axis)."""
    positive = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return bool(positive) and math.log10(max(positive) / min(positive)) > decades


def before_after_png(verification: Verification, script: str | None = None) -> bytes | None:
    """The picture as PNG bytes; None when neither run measured a step."""
    if not verification.before.steps_axis and not (
        verification.after is not None and verification.after.steps_axis
    ):
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10.0, 4.0), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, norm_axes = figure.subplots(1, 2)
    _panel(
        loss_axes,
        verification.before,
        verification.after,
        "loss",
        title="loss ÷ its value at the first step",
        log=False,
    )
    _panel(
        norm_axes,
        verification.before,
        verification.after,
        "total_norm",
        title="total gradient norm applied (log)",
        log=True,
    )
    name = Path(script).name if script else "script"
    figure.suptitle(f"{name} · verification: {verification.status}", fontsize=11)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


def verification_pngs(
    verification: Verification, script: str | None = None
) -> list[tuple[str, bytes]]:
    """``[(file name, PNG)]``: the before/after picture, or nothing when there is none."""
    png = before_after_png(verification, script)
    return [(FILE_NAME, png)] if png is not None else []
