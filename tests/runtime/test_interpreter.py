"""Which interpreter runs the script (``probes.runtime.interpreter``), and one clear line when
that interpreter cannot run the probe: it does not exist, is not Python, has no torch, or has
a torch older than the probe supports."""

from __future__ import annotations

import json
import os
import stat
import sys
import venv
from pathlib import Path

import pytest

from gradient_doctor.probes.runtime.interpreter import (
    InterpreterError,
    activation,
    choose,
    from_option,
)
from tests.conftest import run_cli

from .conftest import fixture

PYTHON2 = Path("/root/.pyenv/versions/2.7.18/bin/python")
PYTHON39 = Path("/root/.pyenv/versions/3.9.18/bin/python")


def _fake_venv(folder: Path) -> Path:
    """A folder shaped like a virtualenv whose bin/python is an executable file."""
    (folder / "bin").mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    python = folder / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def test_project_venv_is_found_from_the_script_folder_upwards(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "project" / ".venv")
    script = tmp_path / "project" / "src" / "deep" / "train.py"
    script.parent.mkdir(parents=True)
    script.touch()
    chosen = choose(script, environ={"VIRTUAL_ENV": "/elsewhere"})
    assert chosen.source == "project-venv"
    assert chosen.path == str(python)  # not resolved: the venv's own bin/python
    assert chosen.environment == str(tmp_path / "project" / ".venv")
    assert ".venv" in chosen.reason


def test_dot_venv_wins_over_venv_in_the_same_folder(tmp_path: Path) -> None:
    _fake_venv(tmp_path / "venv")
    dot = _fake_venv(tmp_path / ".venv")
    script = tmp_path / "train.py"
    script.touch()
    assert choose(script, environ={}).path == str(dot)


def test_the_search_stops_at_the_boundary(tmp_path: Path) -> None:
    _fake_venv(tmp_path / ".venv")
    root = tmp_path / "root"
    script = root / "train.py"
    root.mkdir()
    script.touch()
    env = {"VIRTUAL_ENV": "", "CONDA_PREFIX": ""}
    assert choose(script, boundary=root, environ=env).source == "tool"
    assert choose(script, environ=env).source == "project-venv"


def test_then_virtual_env_then_conda_then_our_own(tmp_path: Path) -> None:
    script = tmp_path / "work" / "train.py"
    script.parent.mkdir()
    script.touch()
    active = _fake_venv(tmp_path / "active")
    conda = tmp_path / "conda"
    _fake_venv(conda)
    both = {"VIRTUAL_ENV": str(tmp_path / "active"), "CONDA_PREFIX": str(conda)}
    boundary = script.parent
    assert choose(script, boundary=boundary, environ=both).path == str(active)
    conda_only = choose(script, boundary=boundary, environ={"CONDA_PREFIX": str(conda)})
    assert conda_only.source == "conda" and "CONDA_PREFIX" in conda_only.reason
    ours = choose(script, boundary=boundary, environ={})
    assert ours.source == "tool" and ours.path == sys.executable


def test_python_option_takes_a_path_a_command_or_a_venv_folder(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "env")
    assert from_option(str(python)).path == str(python)
    assert from_option(str(tmp_path / "env")).path == str(python)
    assert from_option("sh").path.endswith("/sh")
    assert from_option(str(python)).environment == str(tmp_path / "env")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("/no/such/python", "no such file"),
        ("no-such-python-command", "no such command on PATH"),
        ("NOT_EXECUTABLE", "not an executable file"),
        ("EMPTY_FOLDER", "a folder without bin/python"),
    ],
)
def test_python_option_refuses_what_cannot_run(tmp_path: Path, value: str, fragment: str) -> None:
    text = tmp_path / "python.txt"
    text.write_text("print(1)\n")
    (tmp_path / "empty").mkdir()
    value = {"NOT_EXECUTABLE": str(text), "EMPTY_FOLDER": str(tmp_path / "empty")}.get(value, value)
    with pytest.raises(InterpreterError, match=fragment):
        from_option(value)


def test_activation_puts_the_environment_first_on_path(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "env")
    env = activation(from_option(str(python)), {"PATH": "/usr/bin", "PYTHONHOME": "/x"})
    assert env["PATH"].split(os.pathsep)[0] == str(python.parent)
    assert env["VIRTUAL_ENV"] == str(tmp_path / "env") and "PYTHONHOME" not in env


# -- through the command line ------------------------------------------------------------------


def _one_line_error(*args: str) -> str:
    done = run_cli("probe", str(fixture("healthy_mlp")), "--steps", "2", *args)
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.slow
def test_interpreter_without_torch_is_one_line(tmp_path: Path) -> None:
    venv.create(tmp_path / "bare", with_pip=False)
    line = _one_line_error("--python", str(tmp_path / "bare"))
    assert "cannot import torch" in line and "No module named 'torch'" in line


@pytest.mark.slow
def test_torch_older_than_supported_is_one_line(tmp_path: Path) -> None:
    venv.create(tmp_path / "old", with_pip=False)
    (site,) = (tmp_path / "old" / "lib").glob("python*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text('__version__ = "2.1.2+cu121"\n')
    line = _one_line_error("--python", str(tmp_path / "old"))
    assert "torch 2.1.2+cu121" in line and "older than 2.4" in line


@pytest.mark.slow
def test_program_that_is_not_python_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'this is not python'\nexit 3\n")
    fake.chmod(0o755)
    line = _one_line_error("--python", str(fake))
    assert "did not start the probe" in line and "exit code 3" in line
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    text.chmod(0o755)
    assert "cannot run the interpreter" in _one_line_error("--python", str(text))
    assert "no such file" in _one_line_error("--python", str(tmp_path / "missing"))


@pytest.mark.slow
@pytest.mark.skipif(not PYTHON2.exists(), reason="no Python 2 interpreter here")
def test_python_2_is_one_line() -> None:
    line = _one_line_error("--python", str(PYTHON2))
    assert "did not start the probe" in line and "Python 3.10 or newer" in line


@pytest.mark.slow
@pytest.mark.skipif(not PYTHON39.exists(), reason="no Python 3.9 interpreter here")
def test_python_older_than_the_child_needs_is_one_line() -> None:
    line = _one_line_error("--python", str(PYTHON39))
    assert "Python 3.9" in line and "older than 3.10" in line


@pytest.mark.slow
def test_the_result_says_which_interpreter_ran_and_why(tmp_path: Path) -> None:
    done = run_cli(
        "probe",
        str(fixture("healthy_mlp")),
        "--steps",
        "2",
        "--format",
        "json",
        "--python",
        sys.executable,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["interpreter"]["path"] == sys.executable
    assert data["interpreter"]["source"] == "option"
    assert data["interpreter"]["reason"] == f"--python {sys.executable}"
    assert data["interpreter"]["python_version"] == ".".join(map(str, sys.version_info[:3]))
    markdown = run_cli("probe", str(fixture("healthy_mlp")), "--steps", "2")
    assert "| Interpreter |" in markdown.stdout and "virtualenv" in markdown.stdout
