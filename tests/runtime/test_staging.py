"""The child package staged for a run: a copy kept between runs in a private folder of the
temporary directory (checked byte for byte at every run, with bytecode checked against the
sources), or, where no such folder can be had, a per-run copy with the bytecode compiled at
install time still valid for it (a child interpreter of the same version compiles nothing)."""

from __future__ import annotations

import ctypes.util
import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradient_doctor.probes.runtime import launch, run_probe, supervisor
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE

from .conftest import fixture


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


def _loads_cached_bytecode(staged: Path, module: str) -> bool:
    """Whether a child interpreter that may not write bytecode loads ``module``'s from
    ``staged`` (so it compiles nothing on the way to the script's first line)."""
    env = {**os.environ, "PYTHONPATH": str(staged), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-v", "-c", f"import {STAGED_PACKAGE}.{module}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    loaded = str(staged / STAGED_PACKAGE / "__pycache__" / f"{module}.")
    return f"# code object from '{loaded}" in done.stderr


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setattr(launch, "CHILD_CACHE_ROOT", root)
    return root


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="the cache needs POSIX owners")
def test_cached_child_is_made_once_and_loads_its_bytecode(cache_root: Path) -> None:
    first = launch.cached_child()
    assert first is not None and first.parent == cache_root
    assert cache_root.stat().st_mode & 0o777 == 0o700
    package = first / STAGED_PACKAGE
    for module in launch.CHILD_SOURCE.glob("*.py"):
        assert (package / module.name).read_bytes() == module.read_bytes()
    marker = package / "__pycache__" / "marker"
    marker.write_text("same copy")
    assert launch.cached_child() == first
    assert marker.is_file()  # reused, not made again
    assert _loads_cached_bytecode(first, "collector")
    assert [p.name for p in cache_root.iterdir()] == [first.name]  # no half-built copy left


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="the cache needs POSIX owners")
def test_an_altered_cached_copy_is_replaced(cache_root: Path) -> None:
    staged = launch.cached_child()
    assert staged is not None
    altered = staged / STAGED_PACKAGE / "hooks.py"
    altered.write_text("raise SystemExit('not the probe')\n")
    again = launch.cached_child()
    assert again == staged
    assert altered.read_bytes() == (launch.CHILD_SOURCE / "hooks.py").read_bytes()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="the cache needs POSIX owners")
def test_a_cache_folder_others_can_write_or_a_link_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(launch, "CHILD_CACHE_ROOT", shared)
    assert launch.cached_child() is None
    assert list(shared.iterdir()) == []
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private, target_is_directory=True)
    monkeypatch.setattr(launch, "CHILD_CACHE_ROOT", link)
    assert launch.cached_child() is None
    assert list(private.iterdir()) == []


@pytest.mark.slow
def test_a_run_without_a_safe_cache_stages_its_own_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(launch, "CHILD_CACHE_ROOT", shared)
    result = run_probe(fixture("healthy_mlp"), steps=3)
    assert result.status == "stopped", result.message
    assert result.steps == 3
    assert list(shared.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="the cache needs POSIX owners")
def test_making_a_copy_removes_copies_of_other_versions_unused_for_long(cache_root: Path) -> None:
    cache_root.mkdir(mode=0o700)
    stale, recent = cache_root / "child-old", cache_root / "child-recent"
    for folder in (stale, recent):
        (folder / STAGED_PACKAGE).mkdir(parents=True)
    long_ago = time.time() - launch.CHILD_CACHE_MAX_AGE_S - 86_400
    os.utime(stale, (long_ago, long_ago))
    made = launch.cached_child()
    assert made is not None
    assert sorted(p.name for p in cache_root.iterdir()) == sorted([made.name, recent.name])
