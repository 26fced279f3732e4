"""Helpers for the plugin tests: the plugin as Claude Code installs and starts it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from mcp import StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugin"
EXAMPLES = REPO / "examples"
#: Where the pinned npm tools are installed for the tests (never inside the repository).
NPM_CACHE = Path(
    os.environ.get("GRADIENT_DOCTOR_TEST_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gradient-doctor-tests"
)


def load_launcher() -> ModuleType:
    """The plugin's ``scripts/launcher.py`` as a module (it is a script, not a package)."""
    path = PLUGIN / "scripts" / "launcher.py"
    spec = importlib.util.spec_from_file_location("gradient_doctor_plugin_launcher", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def materialize(target: Path) -> Path:
    """A copy of the plugin folder with its links replaced by the files they point to.

    That is the copy Claude Code makes when it installs the plugin into its cache (see
    ``test_claude_code.py``, which checks it against the real ``claude plugin install``).
    """
    shutil.copytree(PLUGIN, target, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    return target


_PLUGIN_VARIABLE = re.compile(r"\$\{(CLAUDE_PLUGIN_ROOT|CLAUDE_PROJECT_DIR|CLAUDE_PLUGIN_DATA)\}")
_ENV_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_like_claude_code(value: str, plugin: dict[str, str], env: dict[str, str]) -> str:
    """Expand a ``.mcp.json`` string the way Claude Code 2.1.x does for a plugin's server.

    First the plugin variables ``${CLAUDE_PLUGIN_ROOT}``, ``${CLAUDE_PROJECT_DIR}`` and
    ``${CLAUDE_PLUGIN_DATA}``, then ``${VAR}`` / ``${VAR:-default}`` from the environment; a
    variable that is unset and has no default is left as written.
    """
    value = _PLUGIN_VARIABLE.sub(lambda m: plugin[m.group(1)], value)

    def from_env(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        return default if default is not None else match.group(0)

    return _ENV_VARIABLE.sub(from_env, value)


def claude_code_server(
    plugin_root: Path,
    project: Path,
    data: Path,
    env: dict[str, str],
    server: str = "gradient-doctor",
) -> StdioServerParameters:
    """The stdio parameters Claude Code derives from the plugin's ``.mcp.json``: variables
    expanded, ``CLAUDE_PLUGIN_ROOT`` / ``CLAUDE_PLUGIN_DATA`` added to the environment, the
    session's folder (the project) as the working folder."""
    config = json.loads((plugin_root / ".mcp.json").read_text(encoding="utf-8"))["mcpServers"]
    entry = config[server]
    plugin_vars = {
        "CLAUDE_PLUGIN_ROOT": str(plugin_root),
        "CLAUDE_PROJECT_DIR": str(project),
        "CLAUDE_PLUGIN_DATA": str(data),
    }
    server_env = {
        **env,
        "CLAUDE_PLUGIN_ROOT": str(plugin_root),
        "CLAUDE_PLUGIN_DATA": str(data),
        **{
            k: expand_like_claude_code(v, plugin_vars, env) for k, v in entry.get("env", {}).items()
        },
    }
    return StdioServerParameters(
        command=expand_like_claude_code(entry["command"], plugin_vars, env),
        args=[expand_like_claude_code(a, plugin_vars, env) for a in entry.get("args", [])],
        env=server_env,
        cwd=str(project),
    )


def base_env(path: str) -> dict[str, str]:
    """The test process's environment with ``PATH`` replaced and no virtualenv markers."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = path
    for name in ("GRADIENT_DOCTOR_EXECUTABLE", "GRADIENT_DOCTOR_SETUP_WAIT_S", "MCP_TIMEOUT"):
        env.pop(name, None)
    return env


def tool_dir() -> Path:
    """The folder of this test run's ``gradient-doctor`` (the repository's dev install)."""
    return Path(sys.executable).parent


def npm_tool(package: str, version: str, binary: str) -> Path:
    """``binary`` of ``package@version``, installed once into the test cache with npm.

    Skips (with the reason) only when npm is missing or its registry cannot be reached; any
    other install failure fails the test.
    """
    target = NPM_CACHE / f"{package.rsplit('/', 1)[-1]}-{version}"
    executable = target / "node_modules" / ".bin" / binary
    if executable.exists():
        return executable
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: cannot fetch {package}@{version}")
    target.mkdir(parents=True, exist_ok=True)
    install = subprocess.run(
        [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(target),
            f"{package}@{version}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if install.returncode != 0 or not executable.exists():
        ping = subprocess.run(
            [npm, "ping"], capture_output=True, text=True, timeout=60, check=False
        )
        if ping.returncode != 0:
            reason = f"the npm registry is unreachable ({ping.stderr.strip()[-200:]})"
            print(f"SKIP: {reason}")
            pytest.skip(reason)
        raise AssertionError(f"npm install {package}@{version} failed:\n{install.stderr[-3000:]}")
    return executable
