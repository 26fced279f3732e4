"""``diagnose(verify=true)`` through the MCP SDK's client.

The verifications run the server as a real subprocess over stdio (``gradient-doctor serve``, or
the same CLI with a broken patch injected first); the one-line refusals use the in-process
server, which answers them without running anything."""

from __future__ import annotations

import base64
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from verify_helpers import BROKEN_PATCH_CLI, EXAMPLES, REPO, folder_state

from gradient_doctor.skill_server.server import build_server

pytestmark = pytest.mark.anyio
STEPS = 8


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    for name in ("buggy_train.py", "healthy_train.py"):
        shutil.copy(EXAMPLES / name, root / name)
    return root


def stdio_server(root: Path, broken_patch: str | None = None) -> StdioServerParameters:
    """``gradient-doctor serve --root ROOT`` as a subprocess over stdio; ``broken_patch``: the
    same CLI with that kind of broken patch injected (``broken_patch_cli.py``)."""
    entry = (
        [str(BROKEN_PATCH_CLI), broken_patch]
        if broken_patch
        else ["-m", "gradient_doctor.skill_server"]
    )
    return StdioServerParameters(
        command=sys.executable,
        args=[*entry, "serve", "--root", str(root)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=str(REPO),
    )


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    return dict(result.structured_content)


@pytest.mark.slow
async def test_diagnose_verify_proves_the_patch_with_progress_and_a_picture(
    workspace: Path,
) -> None:
    before = folder_state(workspace)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with Client(stdio_server(workspace)) as client:
        result = await client.call_tool(
            "diagnose",
            {"path": "buggy_train.py", "steps": STEPS, "verify": True},
            progress_callback=on_progress,
        )
    data = structured(result)
    verification = data["verification"]
    assert verification["status"] == "fixed", verification["verdict"]
    assert verification["patch"] == data["combined_diff"]
    assert {"accum-unscaled-loss", "clip-after-step"} <= set(verification["resolved"])
    assert verification["after"]["steps"] == STEPS
    # The contract's keys (design.md, "check --verify"), each side with its two series.
    assert {"status", "patch", "resolved", "remaining", "new", "before", "after"} <= set(
        verification
    )
    assert not set(verification["new"]) & set(verification["resolved"])
    for side in (verification["before"], verification["after"]):
        assert len(side["total_norm"]) == len(side["loss"]) == len(side["steps_axis"]) == STEPS
    # Progress runs across both runs: 2 × steps in all, ending complete.
    assert progress and all(total == 2 * STEPS for _, total, _ in progress)
    assert progress[-1][0] == 2 * STEPS
    assert "original and patched copy" in (progress[-1][2] or "")
    text = result.content[0].text
    assert "### Verification" in text and "✅ **fixed**" in text
    # The before/after picture: its caption, then the PNG itself as image content.
    blocks = list(result.content)
    captions = [i for i, block in enumerate(blocks) if block.type == "text"]
    figure = next(i for i in captions if blocks[i].text == "Figure: verification.png")
    picture = blocks[figure + 1]
    assert picture.type == "image" and picture.mime_type == "image/png"
    assert base64.b64decode(picture.data).startswith(b"\x89PNG")
    assert folder_state(workspace) == before


@pytest.mark.slow
async def test_diagnose_verify_on_a_healthy_script_is_no_patch(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "diagnose", {"path": "healthy_train.py", "steps": STEPS, "verify": True}
        )
    verification = structured(result)["verification"]
    assert verification["status"] == "no-patch" and verification["after"] is None


@pytest.mark.slow
async def test_a_broken_patch_injected_here_is_broken_and_unsafe(workspace: Path) -> None:
    before = folder_state(workspace)
    async with Client(stdio_server(workspace, broken_patch="runtime")) as client:
        result = await client.call_tool(
            "diagnose", {"path": "buggy_train.py", "steps": STEPS, "verify": True}
        )
    data = structured(result)
    verification = data["verification"]
    assert verification["status"] == "broken" and verification["unsafe"] is True
    assert "step_now" in verification["after"]["traceback_tail"]
    text = result.content[0].text
    assert "❌ **broken**" in text and "Unsafe patch" in text
    assert any("Do not apply the patch below" in r for r in data["recommendations"])
    assert folder_state(workspace) == before


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"verify": True, "run_probe": False}, "cannot be combined with skipping the probe"),
        ({"verify_ids": ["value-clipping"]}, "no patch for value-clipping"),
        ({"verify": True, "path": None, "description": "loss is NaN"}, "needs a script path"),
    ],
)
async def test_verify_refusals_are_one_line(
    workspace: Path, arguments: dict[str, Any], fragment: str
) -> None:
    call = {"path": "buggy_train.py", "steps": 2, **arguments}
    call = {k: v for k, v in call.items() if v is not None}
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("diagnose", call)
    assert result.is_error
    message = result.content[0].text
    assert fragment in message and "\n" not in message.strip()


async def test_verify_is_refused_where_scripts_may_not_run(workspace: Path) -> None:
    async with Client(build_server([workspace], allow_exec=False)) as client:
        result = await client.call_tool(
            "diagnose", {"path": "buggy_train.py", "steps": 2, "verify": True}
        )
    assert result.is_error and "--no-exec" in result.content[0].text
