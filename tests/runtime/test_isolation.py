"""The parent never imports torch; cancellation and timeouts stop the whole process group."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from gradient_doctor.probes.runtime import run_probe_async

from .conftest import fixture

pytestmark = pytest.mark.slow


def test_parent_never_imports_torch() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import gradient_doctor.probes.runtime
        from gradient_doctor.probes.runtime import run_probe
        from gradient_doctor.skill_server.views_probe import probe_markdown
        result = run_probe({str(fixture("healthy_mlp"))!r}, steps=3)
        assert result.status == "stopped", result.message
        probe_markdown(result)
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("TORCH:", loaded)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "TORCH: []" in done.stdout


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (already dead, waiting for its parent) counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.anyio
async def test_cancellation_kills_the_process_group_within_2_s(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    cancelled_at = 0.0

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal cancelled_at
        while not pid_file.exists() or not pid_file.read_text().strip():
            await anyio.sleep(0.05)
        await anyio.sleep(0.2)
        cancelled_at = time.perf_counter()
        scope.cancel()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(watch, scope)
            await run_probe_async(fixture("writes_pid_then_hangs"), [str(pid_file)], timeout_s=120)
    elapsed = time.perf_counter() - cancelled_at
    assert scope.cancelled_caught
    assert elapsed < 2.5
    child, grandchild = (int(p) for p in pid_file.read_text().split())
    deadline = time.time() + 1.0
    while time.time() < deadline and not (_gone(child) and _gone(grandchild)):
        time.sleep(0.05)
    assert _gone(child) and _gone(grandchild)


@pytest.mark.anyio
async def test_progress_callback_sync_and_async() -> None:
    seen: list[tuple[int, int]] = []

    async def on_progress(done: int, total: int) -> None:
        seen.append((done, total))

    result = await run_probe_async(fixture("healthy_mlp"), steps=6, on_progress=on_progress)
    assert result.status == "stopped"
    assert seen and seen[-1] == (6, 6)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    plain: list[int] = []
    await run_probe_async(
        fixture("args_and_cwd"), ["--lr", "0.05"], steps=3, on_progress=lambda d, t: plain.append(d)
    )
    assert plain and plain[-1] == 3


def test_timeout_kills_spawned_grandchild(tmp_path: Path) -> None:
    from gradient_doctor.probes.runtime import run_probe

    pid_file = tmp_path / "pids"
    result = run_probe(fixture("writes_pid_then_hangs"), [str(pid_file)], timeout_s=6)
    assert result.status == "timeout"
    child, grandchild = (int(p) for p in pid_file.read_text().split())
    assert _gone(child) and _gone(grandchild)
