"""The real Claude Code CLI (pinned, from npm) validates, installs and starts the plugin.

Skipped, with the reason printed, only when npm or its registry cannot be reached.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from git_http import serve_repository, snapshot
from plugin_helpers import EXAMPLES, PLUGIN, REPO, base_env, npm_tool, tool_dir

from gradient_doctor.skill_server import plugin_files

pytestmark = pytest.mark.slow

SYSTEM_PATH = os.pathsep.join(["/usr/bin", "/bin"])


@pytest.fixture(scope="module")
def claude() -> Path:
    return npm_tool("@anthropic-ai/claude-code", plugin_files.CLAUDE_CODE_VERSION, "claude")


def _run(
    claude: Path, *args: str, config: Path, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = dict(env or os.environ)
    # A private configuration folder: nothing of the user's ~/.claude is read or written.
    environment["CLAUDE_CONFIG_DIR"] = str(config)
    environment.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run(
        [str(claude), *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_pinned_cli_is_the_version_we_name(claude: Path, tmp_path: Path) -> None:
    version = _run(claude, "--version", config=tmp_path)
    assert version.stdout.split()[0] == plugin_files.CLAUDE_CODE_VERSION


@pytest.mark.parametrize(
    "arguments",
    [
        ["--strict", "."],
        ["--strict", "plugin"],
        ["--profile", "directory", "plugin"],
        ["--strict", "--profile", "directory", "plugin"],
    ],
    ids=["marketplace-strict", "plugin-strict", "plugin-directory", "plugin-directory-strict"],
)
def test_plugin_validate_passes(claude: Path, tmp_path: Path, arguments: list[str]) -> None:
    result = _run(claude, "plugin", "validate", *arguments, config=tmp_path)
    print(f"\n$ claude plugin validate {' '.join(arguments)}\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Validation passed" in result.stdout
    report = _run(claude, "plugin", "validate", "--json", *arguments, config=tmp_path)
    assert report.returncode == 0
    data = json.loads(report.stdout)
    assert not data.get("errors") and not data.get("warnings"), data


def test_validate_fails_on_a_broken_plugin(claude: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(PLUGIN, broken, symlinks=True)
    manifest = broken / ".claude-plugin" / "plugin.json"
    data = json.loads(manifest.read_text())
    data["name"] = "Not A Valid Name!"
    manifest.write_text(json.dumps(data))
    result = _run(claude, "plugin", "validate", "--strict", str(broken), config=tmp_path / "cfg")
    assert result.returncode != 0


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "user-project"
    project.mkdir()
    shutil.copy(EXAMPLES / "buggy_train.py", project / "train.py")
    return project


@pytest.fixture(scope="module")
def git_installed(claude: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Claude Code configuration folder with the plugin installed from a git marketplace:
    the path a GitHub install takes (clone, copy into the plugin cache, start from there)."""
    root = tmp_path_factory.mktemp("git-marketplace")
    config = root / "claude-config"
    source = snapshot(REPO, root / "clone-source")
    with serve_repository(source, root) as url:
        added = _run(claude, "plugin", "marketplace", "add", url, config=config)
        assert added.returncode == 0, added.stdout + added.stderr
        installed = _run(
            claude,
            "plugin",
            "install",
            f"{plugin_files.PLUGIN_NAME}@{plugin_files.MARKETPLACE_NAME}",
            config=config,
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
    return config


def _cached_copy(config: Path) -> Path:
    version = plugin_files.project().version
    cache = config / "plugins" / "cache" / plugin_files.MARKETPLACE_NAME / plugin_files.PLUGIN_NAME
    return cache / version


def _server_line(listed: subprocess.CompletedProcess[str]) -> str:
    return next(
        (x for x in listed.stdout.splitlines() if x.startswith("plugin:gradient-doctor:")), ""
    )


def test_install_copies_the_package_source_as_files(git_installed: Path) -> None:
    copy = _cached_copy(git_installed)
    package = copy / "package"
    for part in ("pyproject.toml", "setup.py", "README.md"):
        assert (package / part).is_file() and not (package / part).is_symlink()
        assert filecmp.cmp(package / part, REPO / part, shallow=False)
    for folder in ("knowledge", "probes", "templates", "skill_server"):
        assert (package / folder).is_dir() and not (package / folder).is_symlink()
        compared = filecmp.dircmp(package / folder, REPO / folder, ignore=["__pycache__"])
        assert not compared.diff_files and not compared.left_only, folder
    assert os.access(copy / "bin" / "gradient-doctor-mcp", os.X_OK)


def test_claude_code_starts_the_server_from_its_cache(
    claude: Path, git_installed: Path, tmp_path: Path
) -> None:
    """Claude Code itself expands .mcp.json, starts the server and checks that it answers;
    with gradient-doctor of this version on PATH, the launcher starts that one."""
    project = _project(tmp_path)
    env = base_env(os.pathsep.join([str(tool_dir()), SYSTEM_PATH]))
    listed = _run(claude, "mcp", "list", config=git_installed, cwd=project, env=env)
    print(f"\n$ claude mcp list\n{listed.stdout}{listed.stderr}")
    line = _server_line(listed)
    assert str(_cached_copy(git_installed) / "bin" / "gradient-doctor-mcp") in line, listed.stdout
    assert f"--project {project}" in line
    assert "Connected" in line, listed.stdout + listed.stderr


def test_claude_code_connects_on_a_fresh_machine_while_the_tool_installs(
    claude: Path, git_installed: Path, tmp_path: Path
) -> None:
    """No gradient-doctor anywhere: the server answers Claude Code's check at once, and the
    environment is installed from the cached copy into the plugin's data folder."""
    project = _project(tmp_path)
    env = base_env(SYSTEM_PATH)
    env["GRADIENT_DOCTOR_SETUP_WAIT_S"] = "0"
    started = time.monotonic()
    listed = _run(claude, "mcp", "list", config=git_installed, cwd=project, env=env)
    first = time.monotonic() - started
    print(f"\n$ claude mcp list   (fresh machine)\n{listed.stdout}{listed.stderr}")
    assert "Connected" in _server_line(listed), listed.stdout + listed.stderr
    data = git_installed / "plugins" / "data"
    # The install goes on in its own process after the check; wait for it (and so leave
    # nothing running behind the test).
    deadline = time.monotonic() + 600
    while not list(data.glob("*/envs/*/.gradient-doctor-ready")):
        assert time.monotonic() < deadline, "the first-run install did not finish"
        log = next(iter(data.glob("*/setup.log")), None)
        assert log is None or "== failed" not in log.read_text(), log.read_text()[-2000:]
        time.sleep(1)
    installed = time.monotonic() - started
    del env["GRADIENT_DOCTOR_SETUP_WAIT_S"]
    started = time.monotonic()
    again = _run(claude, "mcp", "list", config=git_installed, cwd=project, env=env)
    second = time.monotonic() - started
    assert "Connected" in _server_line(again), again.stdout + again.stderr
    print(
        f"fresh machine: claude mcp list {first:.1f} s (connected to the stand-in), "
        f"environment ready after {installed:.1f} s; next claude mcp list {second:.1f} s"
    )
