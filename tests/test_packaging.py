"""The wheel ships the knowledge data and templates: build it, install it into a fresh venv and
run the CLI from outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _torch_spec() -> str:
    """Pin the torch already installed here so the fresh venv takes it from the same source."""
    from importlib.metadata import version

    return os.environ.get("TORCH_SPEC") or f"torch=={version('torch')}"


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("gradient_doctor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(
        n.startswith("gradient_doctor/knowledge/data/") and n.endswith(".yaml") for n in names
    )
    assert any(n.startswith("gradient_doctor/templates/") and n.endswith(".j2") for n in names)
    assert "gradient_doctor/probes/runtime/child/__main__.py" in names
    # One import namespace: nothing at the top level that a user project could collide with.
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gradient_doctor"}, tops

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
            _torch_spec(),
        ],
        check=True,
        cwd=tmp_path,
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    result = subprocess.run(
        [
            str(env_dir / "bin" / "gradient-doctor"),
            "match",
            "loss: nan after 300 steps",
            "--format",
            "json",
        ],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["matches"][0]["id"] == "loss-nan"
    # The installed package, not the checkout, answered.
    where = subprocess.run(
        [str(py), "-c", "import gradient_doctor.knowledge as k; print(k.__file__)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(env_dir) in where
