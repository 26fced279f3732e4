"""The parent never imports torch; cancellation and timeouts stop everything the script
started; hostile scripts (tests/fixtures/isolation) cannot harm the caller or escape."""

from __future__ import annotations

import json
import marshal
import os
import shutil
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


# -- hostile scripts (tests/fixtures/isolation) ---------------------------------------------------

HOSTILE = Path(__file__).resolve().parent.parent / "fixtures" / "isolation"


def hostile(name: str) -> Path:
    """Path of a hostile fixture script."""
    return HOSTILE / f"{name}.py"


@pytest.mark.parametrize("sig", ["TERM", "INT", "HUP", "USR1"])
def test_signals_the_script_sends_its_parent_are_ignored_and_reported(sig: str) -> None:
    from gradient_doctor.probes.runtime import run_probe

    result = run_probe(hostile("kills_parent"), [sig], steps=5)
    assert result.status == "stopped", result.message
    assert result.steps == 5
    assert result.isolation is not None
    assert [s.split()[0] for s in result.isolation.parent_signals] == [f"SIG{sig}"]
    assert result.isolation.parent_killed is None


@pytest.mark.parametrize(("name", "args"), [("kills_parent", ["KILL"]), ("kills_parent_group", [])])
def test_script_that_sigkills_its_parent_ends_its_own_run_only(name: str, args: list[str]) -> None:
    from gradient_doctor.probes.runtime import run_probe

    result = run_probe(hostile(name), args, steps=10)
    # We are the caller: still here. The run says what happened.
    assert result.status == "script-error"
    assert result.isolation is not None and result.isolation.parent_killed == "SIGKILL"
    assert "killed its parent process with SIGKILL" in (result.message or "")
    assert result.steps == 2
    assert result.isolation.left_behind == []  # the script's own process is not "left behind"


def test_setsid_double_fork_daemon_is_collected(tmp_path: Path) -> None:
    from gradient_doctor.probes.runtime import run_probe

    pids = tmp_path / "pids"
    started = time.perf_counter()
    result = run_probe(hostile("setsid_daemon"), [str(pids)], steps=5)
    assert time.perf_counter() - started < 60
    assert result.status == "stopped", result.message
    script, daemon = (int(p) for p in pids.read_text().split())
    assert _gone(daemon) and _gone(script)
    assert result.isolation is not None and len(result.isolation.left_behind) == 1


def test_script_that_closes_every_descriptor_is_measured_truthfully(tmp_path: Path) -> None:
    from gradient_doctor.probes.runtime import run_probe

    log = tmp_path / "own.log"
    result = run_probe(hostile("closes_fds"), [str(log)], steps=6)
    assert result.status == "stopped", result.message
    assert result.steps == 6
    # The script's own file (which took the channel's old descriptor number) holds only its
    # own lines: the probe never wrote into it.
    assert log.read_text().splitlines() == [f"step {n}" for n in range(1, 7)]


@pytest.mark.parametrize("kind", ["python", "torch"])
def test_memory_cap_gives_out_of_memory(kind: str) -> None:
    from gradient_doctor.probes.runtime import Launch, run_probe

    result = run_probe(hostile("allocates"), [kind], steps=5, launch=Launch(max_memory=2 * 2**30))
    assert result.status == "out-of-memory", (result.status, result.message)
    assert result.steps == 2
    assert result.isolation is not None and result.isolation.max_memory == 2 * 2**30


def test_secrets_are_scrubbed_and_the_rest_of_the_environment_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradient_doctor.probes.runtime import Launch, run_probe

    monkeypatch.setenv("GRADIENT_DOCTOR_TOKEN", "secret-token-0123456789")
    monkeypatch.setenv("MY_SERVER_TOKEN", "secret-token-abcdef")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    seen = tmp_path / "env.json"
    result = run_probe(
        hostile("reads_env"),
        [str(seen)],
        steps=3,
        launch=Launch(scrub_env=frozenset({"MY_SERVER_TOKEN"})),
    )
    assert result.status == "stopped", result.message
    env = json.loads(seen.read_text())
    assert "GRADIENT_DOCTOR_TOKEN" not in env and "MY_SERVER_TOKEN" not in env
    assert not [k for k, v in env.items() if "secret-token" in v]
    assert env["HF_HOME"] == str(tmp_path / "hf") and env["CUDA_VISIBLE_DEVICES"] == ""
    assert result.isolation is not None
    assert result.isolation.scrubbed_env == ["GRADIENT_DOCTOR_TOKEN", "MY_SERVER_TOKEN"]


def test_user_packages_named_like_ours_win(tmp_path: Path) -> None:
    from gradient_doctor.probes.runtime import run_probe

    project = tmp_path / "project"
    project.mkdir()
    for name in ("probes", "knowledge", "templates", "skill_server"):
        (project / name).mkdir()
        (project / name / "__init__.py").write_text('OWNER = "user project"\n')
    for name in ("imports_user_packages", "_train"):
        shutil.copy(hostile(name), project / f"{name}.py")
    result = run_probe(project / "imports_user_packages.py", steps=3)
    assert result.status == "stopped", (result.message, result.traceback_tail)


def test_probe_dies_with_its_caller_and_takes_the_daemon_along(tmp_path: Path) -> None:
    """SIGKILL the process that ran the probe: the script and its setsid daemon go too."""
    pids = tmp_path / "pids"
    code = (
        "from gradient_doctor.probes.runtime import run_probe\n"
        f"run_probe({str(hostile('setsid_daemon'))!r}, [{str(pids)!r}, 'hang'], timeout_s=300)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (pids.exists() and pids.read_text().strip()):
            time.sleep(0.05)
        script, daemon = (int(p) for p in pids.read_text().split())
        assert not _gone(script) and not _gone(daemon)
        caller.kill()
        caller.wait(timeout=10)
        deadline = time.time() + 3.0
        while time.time() < deadline and not (_gone(script) and _gone(daemon)):
            time.sleep(0.05)
        assert _gone(script) and _gone(daemon)
    finally:
        caller.kill()


@pytest.mark.parametrize("has_sigtimedwait", [True, False])
def test_supervisor_shim_absorbs_signals_with_and_without_sigtimedwait(
    tmp_path: Path, has_sigtimedwait: bool
) -> None:
    """The supervisor on its own; without ``signal.sigtimedwait`` (macOS) the shim falls back
    to handlers, which know the signal but not its sender."""
    from gradient_doctor.probes.runtime import supervisor

    report = tmp_path / "report.json"
    child = "import os, signal; os.kill(os.getppid(), signal.SIGTERM); print('child done')"
    # Hidden from both modules: the supervisor uses the C module ``_signal`` where it exists.
    hide = (
        ""
        if has_sigtimedwait
        else ("import signal, _signal; del signal.sigtimedwait; del _signal.sigtimedwait; ")
    )
    launcher = (
        f"import sys, runpy; {hide}"
        f"sys.argv = ['supervisor', sys.argv[1]]; "
        f"runpy.run_path({supervisor.__file__!r}, run_name='__main__')"
    )
    config = {
        "command": [sys.executable, "-c", child],
        "cwd": str(tmp_path),
        "max_memory": None,
        "report": str(report),
        "run_folder": str(tmp_path),
        "caller_pid": os.getpid(),
        "grace_s": 1.0,
    }
    # stdin is the lifeline: kept open until the supervisor has finished on its own.
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", launcher, marshal.dumps(config).hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert proc.stdout is not None and proc.stderr is not None
    assert b"child done" in proc.stdout.read(), proc.stderr.read()
    seen = json.loads(report.read_text())
    assert seen["returncode"] == 0 and seen["shim"] == {"exit_code": 0}
    assert [s["signal"] for s in seen["signals"]] == ["SIGTERM"]
    assert (seen["signals"][0]["from_pid"] is not None) == has_sigtimedwait


def test_a_started_run_closed_before_it_is_watched_leaves_nothing(tmp_path: Path) -> None:
    """The CLI starts the run before it imports the runner: if anything fails in between
    (an import, Ctrl-C), closing the started run stops the script and everything it started,
    and removes the run's folder."""
    from gradient_doctor.probes.runtime.launch import start_probe

    pid_file = tmp_path / "pids"
    started = start_probe(fixture("writes_pid_then_hangs"), [str(pid_file)], timeout_s=120)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (pid_file.exists() and pid_file.read_text().strip()):
            time.sleep(0.05)
        child, grandchild = (int(p) for p in pid_file.read_text().split())
        assert not _gone(child) and not _gone(grandchild)
    finally:
        closing_at = time.perf_counter()
        started.close()
    assert time.perf_counter() - closing_at < 2.5
    assert started.process.poll() is not None
    deadline = time.time() + 1.0
    while time.time() < deadline and not (_gone(child) and _gone(grandchild)):
        time.sleep(0.05)
    assert _gone(child) and _gone(grandchild)
    assert not started.folder.exists()
    started.close()  # idempotent
