"""The plugin folder as a Gemini CLI extension, checked by the real (pinned) Gemini CLI.

Skipped, with the reason printed, only when npm or its registry cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from plugin_helpers import EXAMPLES, PLUGIN, base_env, npm_tool, tool_dir

from gradient_doctor.skill_server import plugin_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemini() -> Path:
    return npm_tool("@google/gemini-cli", plugin_files.GEMINI_CLI_VERSION, "gemini")


def _run(
    gemini: Path, *args: str, home: Path, cwd: Path, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    # A private HOME: nothing of the user's ~/.gemini is read or written.
    env = base_env(os.pathsep.join([str(tool_dir()), "/usr/bin", "/bin"]))
    env["HOME"] = str(home)
    env.pop("GEMINI_API_KEY", None)
    return subprocess.run(
        [str(gemini), *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_extension_validates_installs_and_starts_its_server(gemini: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    project = tmp_path / "user-project"
    project.mkdir()
    shutil.copy(EXAMPLES / "buggy_train.py", project / "train.py")

    validated = _run(gemini, "extensions", "validate", str(PLUGIN), home=home, cwd=project)
    print(f"\n$ gemini extensions validate plugin\n{validated.stdout}{validated.stderr}")
    assert validated.returncode == 0
    assert "successfully validated" in validated.stdout + validated.stderr
    broken = tmp_path / "broken"
    shutil.copytree(PLUGIN, broken, symlinks=True)
    (broken / "gemini-extension.json").write_text('{"version": "1"}')
    refused = _run(gemini, "extensions", "validate", str(broken), home=home, cwd=project)
    assert refused.returncode != 0 or "successfully" not in refused.stdout + refused.stderr

    # --consent accepts the third-party notice; "y" trusts the source folder.
    installed = _run(
        gemini,
        "extensions",
        "install",
        str(PLUGIN),
        "--consent",
        home=home,
        cwd=project,
        stdin="y\n",
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listed = _run(gemini, "extensions", "list", home=home, cwd=project)
    text = listed.stdout + listed.stderr
    assert f"{plugin_files.PLUGIN_NAME} ({plugin_files.project().version})" in text
    assert "MCP servers:" in text and "Agent skills:" in text
    assert f"{plugin_files.SKILL_NAME}: Diagnoses and fixes gradient problems" in text

    trusted = home / ".gemini" / "trustedFolders.json"
    trusted.write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    servers = _run(gemini, "mcp", "list", home=home, cwd=project)
    print(f"$ gemini mcp list\n{servers.stdout}{servers.stderr}")
    output = servers.stdout + servers.stderr  # the list goes to stderr in this version
    line = next((x for x in output.splitlines() if "(from gradient-doctor)" in x), "")
    assert f"--project {project}" in line and "Connected" in line, output
