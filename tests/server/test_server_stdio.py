"""The server as a real subprocess over stdio, driven by the SDK's client."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from server_helpers import REPO, process_alive, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _params(root: Path, *extra: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "gradient_doctor.skill_server", "serve", "--root", str(root), *extra],
        env={**os.environ, **(env or {})},
        cwd=str(REPO),
    )


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_initialize_list_call_and_no_torch_in_the_server(
    workspace: Path, tmp_path: Path, mode: str
) -> None:
    modules_file = tmp_path / "modules.txt"
    params = _params(workspace, env={"GRADIENT_DOCTOR_MODULES_REPORT": str(modules_file)})
    async with Client(params, mode=mode) as client:
        assert client.server_info is not None and client.server_info.name == "gradient-doctor"
        tools = {t.name for t in (await client.list_tools()).tools}
        assert "lint_script" in tools and "diagnose" in tools
        assert (await client.list_prompts()).prompts
        result = await client.call_tool("lint_script", {"path": "buggy_train.py"})
        assert {"clip-after-step"} <= {f["id"] for f in structured(result)["findings"]}
        bad = await client.call_tool("lint_script", {"path": "/etc/passwd"})
        assert bad.is_error and "outside the allowed roots" in bad.content[0].text  # type: ignore[union-attr]
        fix = await client.call_tool("get_fix", {"id": "clip-norm"})
        assert not fix.is_error
        matched = await client.call_tool("match_symptoms", {"text": "loss is NaN"})
        assert structured(matched)["matches"]
        catalog = await client.read_resource("gradient-doctor://catalog")
        assert "clip-after-step" in catalog.contents[0].text  # type: ignore[union-attr]
        if mode == "auto":
            # A probe runs torch in its child only; the parent side (and its pictures) stays
            # torch-free.
            probed = await client.call_tool(
                "probe_script", {"path": "buggy_train.py", "steps": 3, "device": "cpu"}
            )
            assert structured(probed)["status"] in ("ok", "stopped")
    # The server wrote its module list on a clean exit after the client closed stdin.
    for _ in range(50):
        if modules_file.exists():
            break
        await anyio.sleep(0.1)
    modules = set(modules_file.read_text().split())
    assert "mcp" in modules and "gradient_doctor.probes.static" in modules
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to watch the child")
async def test_cancelled_probe_kills_the_child_within_2s(workspace: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    async with Client(_params(workspace)) as client:
        outcome: dict[str, object] = {}
        scope = anyio.CancelScope()

        async def long_probe() -> None:
            with scope:
                outcome["result"] = await client.call_tool(
                    "probe_script",
                    {
                        "path": "forever_train.py",
                        "args": [str(pid_file)],
                        "steps": 10_000,
                        "timeout_s": 600,
                        "device": "cpu",
                    },
                )

        async with anyio.create_task_group() as group:
            group.start_soon(long_probe)
            with anyio.fail_after(120):
                while not (pid_file.exists() and pid_file.read_text().strip()):
                    assert "result" not in outcome, f"probe ended early: {outcome['result']}"
                    await anyio.sleep(0.1)
            pid = int(pid_file.read_text())
            await anyio.sleep(1.0)  # let it train a little
            assert process_alive(pid)
            scope.cancel()
            cancelled_at = time.monotonic()
        while process_alive(pid) and time.monotonic() - cancelled_at < 10:
            await anyio.sleep(0.02)
        elapsed = time.monotonic() - cancelled_at
        assert "result" not in outcome
        assert not process_alive(pid), "the training script survived the cancellation"
        print(f"child gone {elapsed:.2f}s after the cancel")
        assert elapsed <= 2.0, f"child took {elapsed:.2f}s to die"
        # The server keeps serving after the cancelled call.
        after = await client.call_tool("explain", {"id": "clip-after-step"})
        assert not after.is_error
