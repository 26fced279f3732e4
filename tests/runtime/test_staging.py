"""The child package staged for a run: its sources, and the bytecode compiled at install time
still valid for them (a child interpreter of the same version then compiles nothing)."""

from __future__ import annotations

import ctypes.util
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradient_doctor.probes.runtime import launch, supervisor
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE


def _installed_copy(tmp_path: Path) -> Path:
    """A copy of the child package as pip installs it: sources plus compiled bytecode."""
    source = launch.CHILD_SOURCE
    installed = tmp_path / "site" / "child"
    installed.mkdir(parents=True)
    for module in source.glob("*.py"):
        shutil.copyfile(module, installed / module.name)
        py_compile.compile(str(installed / module.name), doraise=True)
    return installed


def test_staged_child_loads_the_installed_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _installed_copy(tmp_path)
    monkeypatch.setattr(launch, "CHILD_SOURCE", installed)
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    staged = launch.stage_child(run_folder)
    package = staged / STAGED_PACKAGE
    assert sorted(p.name for p in package.glob("*.py")) == sorted(
        p.name for p in installed.glob("*.py")
    )
    env = {**os.environ, "PYTHONPATH": str(staged), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-v", "-c", f"import {STAGED_PACKAGE}.channel"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    loaded = str(package / "__pycache__" / "channel.")
    assert f"# code object from '{loaded}" in done.stderr, done.stderr[-2000:]


def test_staging_without_bytecode_copies_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _installed_copy(tmp_path)
    shutil.rmtree(installed / "__pycache__")
    monkeypatch.setattr(launch, "CHILD_SOURCE", installed)
    (tmp_path / "run").mkdir()
    package = launch.stage_child(tmp_path / "run") / STAGED_PACKAGE
    assert (package / "__main__.py").is_file()
    assert not (package / "__pycache__").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_prctl_is_found_without_running_ldconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find_library`` runs ``ldconfig -p`` in a subprocess, in the caller and again in the
    supervisor: libc's prctl is found among the process's own symbols instead."""

    def no_ldconfig(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) was called")

    monkeypatch.setattr(ctypes.util, "find_library", no_ldconfig)
    assert supervisor._prctl() is not None
