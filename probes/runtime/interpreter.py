"""Which Python interpreter runs the user's script (parent side; no torch, no subprocess).

The tool is installed once (pip, pipx, ``uv tool``) and pointed at projects that have their
own interpreter and packages, so the probe runs the script with the project's interpreter, not
the tool's. The order, first match wins:

1. ``--python PATH`` (a file, a command on ``PATH``, or a virtualenv folder);
2. the project's virtualenv: ``.venv`` or ``venv`` in the script's folder or a folder above it,
   up to a boundary (the server's allowed root, else the filesystem root);
3. the active virtualenv, ``$VIRTUAL_ENV``;
4. the active conda environment, ``$CONDA_PREFIX``;
5. the tool's own interpreter.

Paths are kept as found, never resolved: a virtualenv's ``bin/python`` is a symlink to the base
interpreter, and following it would lose the virtualenv's packages.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple

#: Folder names taken for a project's virtualenv, in order of preference.
VENV_NAMES = (".venv", "venv")
#: Where a virtualenv keeps its interpreter (POSIX, then Windows).
_VENV_PYTHONS = ("bin/python", "bin/python3", "Scripts/python.exe")

Source = Literal["option", "project-venv", "virtual-env", "conda", "tool"]


class InterpreterError(ValueError):
    """``--python`` names nothing usable: one line, no traceback."""


class Interpreter(NamedTuple):
    """The interpreter chosen for a probe run and why (a named tuple, not a dataclass: see
    ``launch.Launch``)."""

    path: str
    source: Source
    reason: str
    #: The virtualenv (or conda environment) folder it belongs to, if any: the run activates it.
    environment: str | None = None


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _venv_python(folder: Path) -> Path | None:
    for relative in _VENV_PYTHONS:
        candidate = folder / relative
        if _executable(candidate):
            return candidate
    return None


def _environment_of(python: Path) -> str | None:
    """The virtualenv or conda folder holding ``python`` (``.../bin/python``), if it is one."""
    folder = python.parent.parent
    if (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir():
        return str(folder)
    return None


def from_option(python: str, cwd: Path | None = None) -> Interpreter:
    """The interpreter named by ``--python``: a path, a command on PATH, or a virtualenv folder."""
    text = python.strip()
    if not text or "\x00" in text:
        raise InterpreterError("--python is empty")
    candidate = Path(text).expanduser()
    if not candidate.is_absolute() and os.sep not in text:
        found = shutil.which(text)
        if found is None:
            raise InterpreterError(f"--python {text}: no such command on PATH")
        candidate = Path(found)
    elif not candidate.is_absolute():
        candidate = (cwd or Path.cwd()) / candidate
    if candidate.is_dir():
        inside = _venv_python(candidate)
        if inside is None:
            raise InterpreterError(f"--python {text}: a folder without bin/python")
        candidate = inside
    if not candidate.exists():
        raise InterpreterError(f"--python {text}: no such file")
    if not _executable(candidate):
        raise InterpreterError(f"--python {text}: not an executable file")
    path = Path(os.path.abspath(candidate))
    return Interpreter(str(path), "option", f"--python {text}", _environment_of(path))


def find_project_venv(start: Path, boundary: Path | None = None) -> Path | None:
    """The interpreter of the nearest ``.venv`` / ``venv`` from ``start`` upwards.

    The walk stops after ``boundary`` (when ``start`` lies inside it) or at the filesystem root.
    """
    folder = Path(os.path.abspath(start))
    stop = Path(os.path.abspath(boundary)) if boundary is not None else None
    if stop is not None and not folder.is_relative_to(stop):
        stop = None
    while True:
        for name in VENV_NAMES:
            python = _venv_python(folder / name)
            if python is not None:
                return python
        if folder == stop or folder.parent == folder:
            return None
        folder = folder.parent


def choose(
    script: Path,
    python: str | None = None,
    *,
    boundary: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Interpreter:
    """The interpreter for ``script`` (see the module docstring for the order)."""
    if python is not None:
        return from_option(python, cwd)
    env = os.environ if environ is None else environ
    project = find_project_venv(script.parent, boundary)
    if project is not None:
        folder = project.parent.parent
        return Interpreter(
            str(project),
            "project-venv",
            f"the project's virtualenv {folder} (found from the script's folder)",
            str(folder),
        )
    activated: tuple[tuple[str, Source], ...] = (
        ("VIRTUAL_ENV", "virtual-env"),
        ("CONDA_PREFIX", "conda"),
    )
    for variable, source in activated:
        value = env.get(variable, "").strip()
        if not value:
            continue
        found = _venv_python(Path(value))
        if found is not None:
            return Interpreter(
                str(found),
                source,
                f"${variable} ({value})",
                value,  # type: ignore[arg-type]
            )
    return Interpreter(
        sys.executable,
        "tool",
        "the tool's own interpreter (no --python, no .venv or venv from the script's folder "
        "up, no $VIRTUAL_ENV or $CONDA_PREFIX)",
        None,
    )


def activation(interpreter: Interpreter, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` as the environment's own activation script would leave it.

    The script's subprocesses (``python -m ...``, console scripts) then find the same
    environment. Only for an interpreter that belongs to a virtualenv or conda folder.
    """
    env = dict(environ)
    if interpreter.environment is None:
        return env
    folder = Path(interpreter.environment)
    bin_dir = str(Path(interpreter.path).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH", "")) if p)
    env.pop("PYTHONHOME", None)
    if (folder / "conda-meta").is_dir():
        env["CONDA_PREFIX"] = str(folder)
    else:
        env["VIRTUAL_ENV"] = str(folder)
    return env
