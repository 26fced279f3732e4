"""The real wheel, installed like a tool: build it, install it into a clean venv WITHOUT torch,
use the light commands from there, and probe a project that has its own virtualenv (torch and a
dependency the tool's venv lacks) and its own top-level ``probes`` package.

Nothing here imports the checkout: every command runs the installed console script from a
folder outside the repository, with ``PYTHONPATH`` and ``VIRTUAL_ENV`` removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

TRAIN = """\
import probes          # the project's own package, not gradient-doctor's
import projdep         # installed (editable) into the project's venv only
import torch
from torch import nn

assert probes.OWNER == "the project", probes.__file__
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=projdep.LEARNING_RATE)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for _ in range(40):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
"""


def _clean_env(**extra: str) -> dict[str, str]:
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _pip(python: Path, *args: str, cwd: Path) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        check=True,
        cwd=cwd,
        env=_clean_env(),
        timeout=900,
    )


def _torch_spec() -> str:
    """The torch this checkout was set up with (CI: the CPU build on local disk)."""
    from importlib.metadata import version

    return os.environ.get("TORCH_SPEC") or f"torch=={version('torch')}"


def _fresh_copy(target: Path) -> Path:
    """The tracked files of the checkout, copied: the wheel builds from what a clone has, not
    from a ``build/`` folder left over from earlier builds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The wheel, a tool venv with it (no torch), and a project with its own venv."""
    base = tmp_path_factory.mktemp("packaging")
    dist = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(_fresh_copy(base / "source"))],
        check=True, cwd=base, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("gradient_doctor-*.whl")

    tool = base / "tool-venv"
    venv.create(tool, with_pip=True)
    _pip(tool / "bin" / "python", str(wheel), cwd=base)

    project = base / "project"
    (project / "probes").mkdir(parents=True)
    (project / "probes" / "__init__.py").write_text('OWNER = "the project"\n')
    dependency = base / "projdep-source"  # outside the project: only the install provides it
    dependency.mkdir()
    (dependency / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "projdep"\nversion = "0.1"\n'
        '[tool.setuptools]\npy-modules = ["projdep"]\n'
    )
    (dependency / "projdep.py").write_text("LEARNING_RATE = 0.05\n")
    (project / "train.py").write_text(TRAIN)
    venv.create(project / ".venv", with_pip=True)
    project_python = project / ".venv" / "bin" / "python"
    _pip(project_python, _torch_spec(), cwd=base)
    _pip(project_python, "-e", str(dependency), cwd=base)

    outside = base / "elsewhere"
    outside.mkdir()
    yield {"wheel": wheel, "tool": tool, "project": project, "outside": outside}


def _run(
    built: dict[str, Path], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(built["tool"] / "bin" / "gradient-doctor"), *args],
        cwd=built["outside"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_wheel_has_one_namespace_and_torch_only_as_an_extra(built: dict[str, Path]) -> None:
    archive = zipfile.ZipFile(built["wheel"])
    names = archive.namelist()
    assert any(
        n.startswith("gradient_doctor/knowledge/data/") and n.endswith(".yaml") for n in names
    )
    assert any(n.startswith("gradient_doctor/templates/") and n.endswith(".j2") for n in names)
    assert "gradient_doctor/probes/runtime/child/__main__.py" in names
    assert "gradient_doctor/probes/runtime/supervisor.py" in names
    # One import namespace: nothing at the top level that a user project could collide with.
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gradient_doctor"}, tops
    (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(archive.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    torch_lines = [r for r in requires if r.split()[0].lower().startswith("torch")]
    assert torch_lines and all('extra == "probe"' in r for r in torch_lines), torch_lines


def test_plain_install_has_no_torch_and_no_cuda(built: dict[str, Path]) -> None:
    listed = subprocess.run(
        [str(built["tool"] / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, check=True, env=_clean_env(),
    )  # fmt: skip
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "gradient-doctor" in installed
    assert not {n for n in installed if n == "torch" or n.startswith(("nvidia-", "triton"))}
    for module in ("torch", "projdep"):  # the project's dependencies are not the tool's
        probe = subprocess.run(
            [str(built["tool"] / "bin" / "python"), "-c", f"import {module}"],
            capture_output=True, text=True, env=_clean_env(),
        )  # fmt: skip
        assert probe.returncode != 0, module


def test_light_commands_work_without_torch(built: dict[str, Path]) -> None:
    match = _run(built, "match", "loss: nan after 300 steps", "--format", "json")
    assert match.returncode == 0, match.stderr
    assert json.loads(match.stdout)["matches"][0]["id"] == "loss-nan"
    explain = _run(built, "explain", "clip-after-step")
    assert explain.returncode == 0 and "clip" in explain.stdout.lower(), explain.stderr
    lint = _run(built, "lint", str(REPO / "examples" / "buggy_train.py"), "--format", "json")
    assert lint.returncode == 1, lint.stderr
    assert "clip-after-step" in lint.stdout
    where = subprocess.run(
        [str(built["tool"] / "bin" / "python"), "-c",
         "import gradient_doctor.knowledge as k; print(k.__file__)"],
        capture_output=True, text=True, check=True, cwd=built["outside"], env=_clean_env(),
    ).stdout  # fmt: skip
    assert str(built["tool"]) in where


@pytest.mark.anyio
async def test_installed_server_over_stdio(built: dict[str, Path]) -> None:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=str(built["tool"] / "bin" / "gradient-doctor"),
        args=["serve", "--root", str(built["project"])],
        env=_clean_env(XDG_CACHE_HOME=str(built["outside"] / "cache")),
        cwd=str(built["outside"]),
    )
    async with Client(params, mode="legacy") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        probed = await client.call_tool(
            "probe_script", {"path": "train.py", "steps": 3, "plots": False}
        )
    assert {"diagnose", "probe_script", "lint_script"} <= tools
    data = probed.structured_content
    assert data is not None and data["status"] == "stopped", data["measurements"].get("message")
    assert data["measurements"]["interpreter"]["source"] == "project-venv"


def test_installed_tool_probes_the_project_in_its_own_venv(built: dict[str, Path]) -> None:
    done = _run(built, "probe", str(built["project"] / "train.py"), "--steps", "3",
                "--format", "json")  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["status"] == "stopped", result["message"]
    assert result["steps"] == 3
    assert result["interpreter"]["source"] == "project-venv"
    assert result["interpreter"]["path"] == str(built["project"] / ".venv" / "bin" / "python")
    assert result["isolation"]["working_dir"] == str(built["project"])
    checked = _run(built, "check", str(built["project"] / "train.py"), "--steps", "3",
                   "--format", "json")  # fmt: skip
    assert checked.returncode in (0, 1), checked.stderr
    assert json.loads(checked.stdout)["probe_status"] == "stopped"
