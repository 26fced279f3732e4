"""The total-norm picture labels what the script's clip did: a clip before the step shaped the
applied update; a clip after the step did not, and is not called "applied". The labels are
read back from the PNG's own text (its ``Description``: the legend entries)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

from .conftest import fixture


def png_text(path: Path) -> dict[str, str]:
    """The tEXt/iTXt chunks of a PNG file (keyword → text)."""
    data, found, position = path.read_bytes(), {}, 8
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            found[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            found[key.decode("latin-1")] = rest[2:].split(b"\0", 2)[2].decode("utf-8")
        position += 12 + length
    return found


def _total_norm_legend(script: Path, folder: Path) -> str:
    done = run_cli(
        "probe", str(script), "--steps", "8", "--python", sys.executable, "--plots", str(folder)
    )
    assert done.returncode in (0, 1), done.stderr
    return png_text(folder / "total-norm.png")["Description"]


@pytest.mark.slow
def test_a_clip_after_the_step_is_not_labelled_applied(tmp_path: Path) -> None:
    legend = _total_norm_legend(fixture("clip_after_step"), tmp_path)
    assert "applied;" not in legend and "before clipping" not in legend
    assert "the clip ran after the step" in legend
    assert "clip max_norm = 1 (clip after the step: not applied)" in legend


@pytest.mark.slow
def test_a_clip_before_the_step_is_labelled_applied(tmp_path: Path) -> None:
    legend = _total_norm_legend(fixture("healthy_lstm_clip"), tmp_path)
    assert "before clipping" in legend and "after clipping (applied;" in legend
    assert "not applied" not in legend
