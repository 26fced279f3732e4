"""Start the probe's supervisor before the command line is even parsed.

The supervisor's interpreter (``python -I -S`` and the few modules it needs before it can fork
the script's process) takes some 10 ms to start. The CLI's ``probe`` command calls
:func:`prestart_supervisor` first thing, so that this start runs beside the CLI's own imports
and argument parsing instead of after them: the supervisor then waits, with nothing started
below it, for its configuration on its stdin (:data:`CONFIG_ON_STDIN`), which
``launch.start_probe`` writes once it has checked the input (:func:`take_prestarted`). A run
that never comes (a usage error, ``--help``) closes that pipe as the CLI exits, and the waiting
supervisor ends without doing anything.

Standard library only, and only what ``subprocess`` needs: this runs before everything else.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: Environment variables never passed to the script (nor to the supervisor above it): the
#: server's bearer token.
SECRET_ENV = frozenset({"GRADIENT_DOCTOR_TOKEN"})
#: The supervisor's argument that says "read the configuration from stdin, one line".
CONFIG_ON_STDIN = "-"
#: The supervisor's file (``probes/runtime/supervisor.py``): never imported by the tool.
SUPERVISOR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")

_prestarted: list[subprocess.Popen[bytes]] = []


def supervisor_command(config: str, supervisor_path: str = SUPERVISOR_PATH) -> list[str]:
    """``python -I -S -c CODE CONFIG``: CODE imports the supervisor as a module from its folder
    (appended to the path, after the standard library) and runs it. Imported, not run by path:
    a script given by path is compiled on every run (some 2.5 ms of the time before the script's
    interpreter can start), a module loads its cached bytecode. ``CONFIG``: the settings as
    :mod:`marshal` bytes in hex, or :data:`CONFIG_ON_STDIN`."""
    folder, name = os.path.split(os.path.splitext(supervisor_path)[0])
    code = f"import sys; sys.path.append({folder!r}); import {name}; {name}.run()"
    return [sys.executable, "-I", "-S", "-c", code, config]


def prestart_supervisor() -> None:
    """Start a supervisor that waits for its configuration (idempotent; a failure to start is
    ignored: ``start_probe`` then starts one the usual way). Its environment is the caller's
    without :data:`SECRET_ENV`; the script's own environment travels in the configuration."""
    if _prestarted:
        return
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    try:
        process = subprocess.Popen(
            supervisor_command(CONFIG_ON_STDIN),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return
    _prestarted.append(process)


def take_prestarted() -> subprocess.Popen[bytes] | None:
    """The waiting supervisor started by :func:`prestart_supervisor`, once (None: there is
    none, or it has already ended)."""
    while _prestarted:
        process = _prestarted.pop()
        if process.poll() is None:
            return process
    return None
