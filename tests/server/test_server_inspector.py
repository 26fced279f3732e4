"""Interop: the official MCP Inspector CLI (from npm) drives the server over stdio."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import REPO

pytestmark = pytest.mark.slow

INSPECTOR = "@modelcontextprotocol/inspector"
#: The first run downloads the inspector from npm; CI gets a generous allowance.
NPX_TIMEOUT_S = 280


def _inspector(root: Path, *method_args: str) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed: cannot run the MCP Inspector")
    command = [
        npx,
        "-y",
        INSPECTOR,
        "--cli",
        sys.executable,
        "-m",
        "skill_server",
        "serve",
        "--root",
        str(root),
        *method_args,
    ]
    try:
        result = subprocess.run(
            command,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=NPX_TIMEOUT_S,
            env={**os.environ, "npm_config_update_notifier": "false"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the MCP Inspector did not finish within {NPX_TIMEOUT_S}s")
    unreachable = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "network request")
    if result.returncode != 0 and any(word in result.stderr for word in unreachable):
        reason = "npm registry unreachable: " + result.stderr.strip().splitlines()[-1]
        print(reason)
        pytest.skip(reason)
    return result


def _json(stdout: str) -> dict:  # type: ignore[type-arg]
    return json.loads(stdout[stdout.index("{") :])


def test_inspector_lists_the_tools(workspace: Path) -> None:
    result = _inspector(workspace, "--method", "tools/list")
    assert result.returncode == 0, result.stderr[-2000:]
    names = {tool["name"] for tool in _json(result.stdout)["tools"]}
    assert names == {
        "match_symptoms",
        "lint_script",
        "probe_script",
        "diagnose",
        "get_fix",
        "explain",
    }


def test_inspector_calls_a_tool(workspace: Path) -> None:
    result = _inspector(
        workspace,
        "--method",
        "tools/call",
        "--tool-name",
        "explain",
        "--tool-arg",
        "id=accum-unscaled-loss",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = _json(result.stdout)
    assert data.get("isError") in (None, False), data
    assert data["structuredContent"]["id"] == "accum-unscaled-loss"
    assert data["structuredContent"]["severity"] == "critical"


def test_inspector_reads_a_resource_and_lists_prompts(workspace: Path) -> None:
    prompts = _inspector(workspace, "--method", "prompts/list")
    assert prompts.returncode == 0, prompts.stderr[-2000:]
    assert {p["name"] for p in _json(prompts.stdout)["prompts"]} == {
        "check-gradients",
        "triage",
        "review-training-loop",
    }
