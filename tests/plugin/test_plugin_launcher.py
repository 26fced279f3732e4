"""The plugin's server and CLI start the way Claude Code starts them, from an installed copy.

The plugin folder is copied with its links materialized (what ``claude plugin install`` does,
checked in ``test_claude_code.py``), ``.mcp.json`` is expanded the way Claude Code expands it,
and the server runs with the user's project as its working folder; the SDK client drives it
over stdio.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from plugin_helpers import (
    EXAMPLES,
    base_env,
    claude_code_server,
    load_launcher,
    materialize,
    tool_dir,
)

pytestmark = pytest.mark.anyio

SYSTEM_PATH = os.pathsep.join(["/usr/bin", "/bin"])


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Path:
    """The plugin as it lies in Claude Code's cache after an install."""
    return materialize(tmp_path / "cache" / "gradient-doctor" / "0.1.0")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project with a training script that clips after the step."""
    root = tmp_path / "user-project"
    root.mkdir()
    shutil.copy(EXAMPLES / "buggy_train.py", root / "train.py")
    return root


def _structured(result: object) -> dict[str, object]:
    assert not getattr(result, "is_error", False), getattr(result, "content", None)
    content = getattr(result, "structured_content", None)
    assert content is not None
    return dict(content)


async def test_mcp_json_server_as_claude_code_starts_it(
    installed_plugin: Path, project: Path, tmp_path: Path
) -> None:
    data = tmp_path / "plugin-data"
    env = base_env(os.pathsep.join([str(tool_dir()), SYSTEM_PATH]))
    params = claude_code_server(installed_plugin, project, data, env)
    assert params.args[0] == f"{installed_plugin}/bin/gradient-doctor-mcp"
    assert params.args[1:] == ["--project", str(project)]
    async with Client(params) as client:
        assert client.server_info is not None and client.server_info.name == "gradient-doctor"
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"diagnose", "lint_script", "get_fix", "explain"} <= tools
        # A relative path resolves in the user's project: the server is rooted there.
        found = _structured(await client.call_tool("lint_script", {"path": "train.py"}))
        assert "clip-after-step" in {f["id"] for f in found["findings"]}  # type: ignore[union-attr]
        outside = await client.call_tool("lint_script", {"path": str(EXAMPLES / "buggy_train.py")})
        assert outside.is_error
    # gradient-doctor came from PATH (same version), so nothing was installed.
    assert not (data / "envs").exists()


async def test_unexpanded_project_variable_falls_back_to_the_working_folder(
    installed_plugin: Path, project: Path, tmp_path: Path
) -> None:
    env = base_env(os.pathsep.join([str(tool_dir()), SYSTEM_PATH]))
    params = claude_code_server(installed_plugin, project, tmp_path / "data", env)
    params.args = [params.args[0], "--project", "${CLAUDE_PROJECT_DIR}"]  # a host without it
    async with Client(params) as client:
        found = _structured(await client.call_tool("lint_script", {"path": "train.py"}))
        assert found["findings"]


def test_project_root_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = load_launcher()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLAUDE_PROJECT_DIR", raising=False)
    assert launcher.project_root(["--project", "${CLAUDE_PROJECT_DIR}"]) == (tmp_path, [])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(elsewhere))
    assert launcher.project_root(["--no-exec"]) == (elsewhere, ["--no-exec"])
    assert launcher.project_root(["--project", str(tmp_path)])[0] == tmp_path
    with pytest.raises(launcher.LaunchError, match="does not exist"):
        launcher.project_root(["--project", str(tmp_path / "missing")])


def test_python_missing_is_said_in_one_line(installed_plugin: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("dirname",):  # what the shim itself needs besides the shell
        found = shutil.which(tool)
        assert found is not None
        (bare / tool).symlink_to(found)
    sh = shutil.which("sh")
    assert sh is not None
    for shim in ("gradient-doctor-mcp", "gradient-doctor"):
        result = subprocess.run(
            [sh, str(installed_plugin / "bin" / shim)],
            env={"PATH": str(bare), "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 127
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Python 3.10 or newer" in lines[0], result.stderr


def test_cli_shim_runs_the_installed_tool_and_skips_itself(
    installed_plugin: Path, project: Path
) -> None:
    own_bin = installed_plugin / "bin"
    env = base_env(os.pathsep.join([str(own_bin), str(tool_dir()), SYSTEM_PATH]))
    result = subprocess.run(
        ["gradient-doctor", "lint", "train.py", "--format", "json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr  # a critical finding
    assert "clip-after-step" in result.stdout
    assert shutil.which("gradient-doctor", path=env["PATH"]) == str(own_bin / "gradient-doctor")


def _fake_install(prefix: Path, version: str) -> Path:
    executable = prefix / "bin" / "gradient-doctor"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\nexit 0\n")
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR)
    info = prefix / "lib" / "python3.11" / "site-packages" / f"gradient_doctor-{version}.dist-info"
    info.mkdir(parents=True)
    return executable


def test_a_gradient_doctor_of_another_version_on_path_is_not_used(
    installed_plugin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    launcher = load_launcher()
    monkeypatch.setattr(launcher, "PLUGIN_ROOT", installed_plugin)
    monkeypatch.setattr(launcher, "BIN_DIR", installed_plugin / "bin")
    monkeypatch.delenv("GRADIENT_DOCTOR_EXECUTABLE", raising=False)
    version = launcher.plugin_version()
    old = _fake_install(tmp_path / "old", "0.0.1")
    same = _fake_install(tmp_path / "same", version)
    monkeypatch.setenv("PATH", os.pathsep.join([str(installed_plugin / "bin"), str(old.parent)]))
    assert launcher.find_installed() is None
    assert "version 0.0.1" in capsys.readouterr().err
    monkeypatch.setenv("PATH", os.pathsep.join([str(old.parent), str(same.parent)]))
    assert launcher.find_installed() is None  # the first one on PATH decides
    monkeypatch.setenv("PATH", str(same.parent))
    assert launcher.find_installed() == (same, "PATH")
    monkeypatch.setenv("GRADIENT_DOCTOR_EXECUTABLE", str(old))
    assert launcher.find_installed() == (old, "GRADIENT_DOCTOR_EXECUTABLE")


def test_the_environment_key_follows_the_source(
    installed_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = load_launcher()
    monkeypatch.setattr(launcher, "PLUGIN_ROOT", installed_plugin)
    monkeypatch.setattr(launcher, "PACKAGE_DIR", installed_plugin / "package")
    before = launcher.environment_key()
    assert before.startswith(launcher.plugin_version() + "-")
    (installed_plugin / "package" / "knowledge" / "__pycache__").mkdir(exist_ok=True)
    (installed_plugin / "package" / "knowledge" / "__pycache__" / "x.pyc").write_bytes(b"x")
    assert launcher.environment_key() == before
    rules = installed_plugin / "package" / "knowledge" / "data" / "red_flags.yaml"
    rules.write_text(rules.read_text() + "\n# changed\n")
    assert launcher.environment_key() != before
    (installed_plugin / "package" / "setup.py").unlink()
    with pytest.raises(launcher.LaunchError, match="incomplete"):
        launcher.check_package_source()


def _fresh_machine_env(tmp_path: Path) -> dict[str, str]:
    """No gradient-doctor anywhere on PATH; the launcher runs on this test's interpreter."""
    env = base_env(SYSTEM_PATH)
    env["GRADIENT_DOCTOR_BOOTSTRAP_PYTHON"] = sys.executable
    env["HOME"] = os.environ.get("HOME", str(tmp_path))
    return env


@pytest.mark.slow
async def test_first_run_installs_from_the_plugin_copy_while_the_server_answers(
    installed_plugin: Path, project: Path, tmp_path: Path
) -> None:
    data = tmp_path / "plugin-data"
    env = _fresh_machine_env(tmp_path)
    env["GRADIENT_DOCTOR_SETUP_WAIT_S"] = "0"  # answer the handshake at once, as after 20 s
    params = claude_code_server(installed_plugin, project, data, env)
    started = time.monotonic()
    async with Client(params) as client:
        connected = time.monotonic() - started
        assert client.server_info is not None and client.server_info.name == "gradient-doctor"
        assert (await client.list_tools()).tools == []  # installing: nothing to offer yet
        early = await client.call_tool("explain", {"id": "clip-after-step"})
        assert early.is_error and "being installed" in early.content[0].text  # type: ignore[union-attr]
        tools: list[str] = []
        with anyio.fail_after(600):
            while not tools:
                await anyio.sleep(1)
                tools = [t.name for t in (await client.list_tools()).tools]
        installed = time.monotonic() - started
        assert "diagnose" in tools
        found = _structured(await client.call_tool("lint_script", {"path": "train.py"}))
        assert "clip-after-step" in {f["id"] for f in found["findings"]}  # type: ignore[union-attr]
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert "check-gradients" in prompts
    log = (data / "setup.log").read_text()
    assert "== ready in" in log
    (environment,) = [p for p in (data / "envs").iterdir() if not p.name.startswith(".")]
    assert (environment / ".gradient-doctor-ready").is_file()
    # The environment holds no torch: the server never needs it.
    assert not list(environment.glob("lib/python*/site-packages/torch"))
    # The next start uses the environment at once.
    started = time.monotonic()
    async with Client(params) as client:
        assert [t.name for t in (await client.list_tools()).tools]
        second = time.monotonic() - started
    print(
        f"\nfirst run: handshake answered after {connected:.2f} s, tools after "
        f"{installed:.1f} s; second start: tools after {second:.2f} s"
    )


@pytest.mark.slow
async def test_a_failed_install_is_one_line_for_the_cli_and_an_error_for_the_tools(
    installed_plugin: Path, project: Path, tmp_path: Path
) -> None:
    data = tmp_path / "plugin-data"
    env = _fresh_machine_env(tmp_path)
    # An index that cannot be reached: pip cannot fetch the build backend.
    env.update(
        {
            "CLAUDE_PLUGIN_DATA": str(data),
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(tmp_path / "no-wheels-here"),
        }
    )
    env.pop("PIP_EXTRA_INDEX_URL", None)
    result = subprocess.run(
        [str(installed_plugin / "bin" / "gradient-doctor"), "catalog"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gradient-doctor: setting up failed (") and "log: " in last, last
    assert not any((data / "envs").glob("*/.gradient-doctor-ready"))
    env["GRADIENT_DOCTOR_SETUP_WAIT_S"] = "0"
    params = claude_code_server(installed_plugin, project, data, env)
    async with Client(params) as client:
        with anyio.fail_after(300):
            while True:
                answer = await client.call_tool("explain", {"id": "clip-after-step"})
                assert answer.is_error
                text = answer.content[0].text  # type: ignore[union-attr]
                if "setting up failed" in text:
                    break
                await anyio.sleep(1)
