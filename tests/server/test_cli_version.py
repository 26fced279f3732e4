"""``gradient-doctor --version`` through the real command line."""

from __future__ import annotations

import re
from importlib import metadata

from server_helpers import REPO

from tests.conftest import run_cli


def test_version_prints_the_installed_distribution_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    installed = metadata.version("gradient-doctor")
    assert done.stdout == f"gradient-doctor {installed}\n"
    # The installed metadata is this checkout's own (an editable or wheel install of it).
    # (tomllib is 3.11+: the project supports 3.10, so the line is read as text.)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE)
    assert declared is not None and installed == declared[1]


def test_version_is_listed_in_the_help() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    assert "--version" in done.stdout
