"""Pictures of a probe run: produced, readable sizes, not blank, and showing what happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradient_doctor.probes.runtime import ProbeResult, run_probe
from gradient_doctor.probes.runtime.plots import (
    plot_pngs,
    short_layer_name,
    spike_steps,
    write_plots,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "distributed"
SPIKE_RED = (0xD6, 0x27, 0x28)


@pytest.fixture(scope="module")
def healthy() -> ProbeResult:
    return run_probe(FIXTURES / "plots_healthy.py", steps=24, sample_every=4, timeout_s=120)


@pytest.fixture(scope="module")
def exploding() -> ProbeResult:
    return run_probe(FIXTURES / "plots_exploding.py", steps=24, sample_every=4, timeout_s=120)


def _pixels(path: Path):  # type: ignore[no-untyped-def]
    import matplotlib.image as mpimg

    image = mpimg.imread(path)  # float RGBA in [0, 1]
    return (image[..., :3] * 255).round().astype(int)


def _ink_fraction(path: Path) -> float:
    """Share of pixels that are not the white background."""
    rgb = _pixels(path)
    return float((rgb.min(axis=-1) < 245).mean())


def _count_colour(path: Path, colour: tuple[int, int, int], tolerance: int = 12) -> int:
    import numpy as np

    rgb = _pixels(path)
    close = np.abs(rgb - np.array(colour)).max(axis=-1) <= tolerance
    return int(close.sum())


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 15_000, f"{path.name} is suspiciously small ({len(data)} bytes)"
    height, width = _pixels(path).shape[:2]
    assert width >= 800 and height >= 300, (path.name, width, height)
    assert _ink_fraction(path) > 0.03, f"{path.name} looks blank"


@pytest.mark.slow
def test_healthy_run_gives_flow_norm_and_dead_unit_pictures(
    healthy: ProbeResult, tmp_path: Path
) -> None:
    assert healthy.ok, healthy.message
    written = write_plots(healthy, tmp_path / "plots")
    names = [p.name for p in written]
    assert names == ["gradient-flow.png", "total-norm.png", "dead-units.png"]
    for path in written:
        _check_png(path)
    # No spike and no NaN in a healthy run: no red markers on the norm plot.
    assert _count_colour(tmp_path / "plots" / "total-norm.png", SPIKE_RED) < 20


@pytest.mark.slow
def test_exploding_run_marks_its_spikes(exploding: ProbeResult, tmp_path: Path) -> None:
    assert exploding.ok, exploding.message
    raw = [r.total_norm for r in exploding.records]
    spikes = spike_steps([r.step for r in exploding.records], raw, 10.0)
    assert spikes, raw  # the fixture feeds two outlier batches
    assert "grad-norm-spikes" in [f.id for f in exploding.findings]
    written = write_plots(exploding, tmp_path)
    for path in written:
        _check_png(path)
    assert _count_colour(tmp_path / "total-norm.png", SPIKE_RED) > 100


@pytest.mark.slow
def test_pictures_differ_between_runs(healthy: ProbeResult, exploding: ProbeResult) -> None:
    first = dict(plot_pngs(healthy))
    second = dict(plot_pngs(exploding))
    assert first["total-norm.png"] != second["total-norm.png"]
    assert first["gradient-flow.png"] != second["gradient-flow.png"]


def test_no_steps_means_no_pictures() -> None:
    empty = ProbeResult(
        status="no-training-loop",
        script="x.py",
        steps=0,
        steps_requested=5,
        sample_every=5,
        profile="default",
    )
    assert plot_pngs(empty) == []


def test_long_layer_names_are_shortened_from_the_left() -> None:
    name = "encoder_transformer_blocks.0.feed_forward_projection"
    short = short_layer_name(name)
    assert len(short) <= 34 and short.startswith("…")
    assert short.endswith("blocks.0.feed_forward_projection")
    assert short_layer_name("model.h.3.mlp") == "model.h.3.mlp"


def test_spike_rule_needs_an_isolated_jump() -> None:
    steps = list(range(1, 13))
    flat = [1.0] * 12
    assert spike_steps(steps, flat, 10.0) == []
    one = [1.0] * 7 + [50.0] + [1.0] * 4
    assert spike_steps(steps, one, 10.0) == [8]
    rise = [1.0] * 7 + [50.0] * 5  # a level shift is not a spike
    assert spike_steps(steps, rise, 10.0) == []


def test_importing_the_probe_does_not_import_matplotlib() -> None:
    code = "import sys, probes.runtime, probes; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_cli_writes_the_pictures_and_keeps_json_clean(tmp_path: Path, cli: Any) -> None:
    folder = tmp_path / "pictures" / "run1"
    done = cli(
        "probe",
        str(FIXTURES / "plots_healthy.py"),
        "--steps",
        "8",
        "--sample-every",
        "4",
        "--plots",
        str(folder),
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "stopped"
    assert "plots:" in done.stderr
    for name in ("gradient-flow.png", "total-norm.png", "dead-units.png"):
        _check_png(folder / name)


def test_cli_refuses_a_plots_folder_it_cannot_create(tmp_path: Path, cli: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = cli("probe", str(FIXTURES / "plots_healthy.py"), "--plots", str(blocker / "x"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--plots" in done.stderr


def test_two_optimizers_get_one_line_each_and_no_nan_marks(tmp_path: Path) -> None:
    """A GAN's discriminator and generator: separate series, neither painted as NaN at the
    other's steps."""
    gan = Path(__file__).resolve().parents[1] / "fixtures" / "runtime" / "gan_two_optimizers.py"
    result = run_probe(gan, steps=16, sample_every=4, timeout_s=120)
    assert result.status == "stopped", result.message
    assert result.optimizer_kinds == ["Adam", "Adam"]
    written = {p.name: p for p in write_plots(result, tmp_path)}
    total = written["total-norm.png"]
    _check_png(total)
    assert _count_colour(total, (0x1F, 0x77, 0xB4)) > 200  # optimizer 0's line
    assert _count_colour(total, (0x2C, 0xA0, 0x2C)) > 200  # optimizer 1's line
    assert _count_colour(total, SPIKE_RED) < 50  # no NaN/Inf marks, no spike rings
